package testenv

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// SecretsKey is the local key tests seal webhook secrets with: the GENBOX_WEBHOOK_SECRETS_KEY
// of a service under test, so it opens what Secrets sealed.
const SecretsKey = secretbox.LocalPrefix + "Z2VuYm94LXRlc3RzLW9ubHktbm90LWEtc2VjcmV0LSE="

// Secrets returns a box of SecretsKey.
func Secrets() *secretbox.Box {
	l, err := secretbox.NewLocal(SecretsKey)
	if err != nil {
		panic(err) // SecretsKey is a constant of the right form
	}
	return secretbox.New(l)
}

// Tenant creates tenant id in st with the default limits and a new webhook secret, and returns
// the secret: what a Receiver of the tenant's webhooks verifies with. A store without a secrets
// box gets Secrets' (what the services under test open with).
func Tenant(t testing.TB, st *store.Store, id string) string {
	t.Helper()
	if st.Secrets == nil {
		st.Secrets = Secrets()
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateTenant(context.Background(), id, store.DefaultLimits(), secret); err != nil {
		t.Fatal(err)
	}
	return secret
}

// GetTask reads task id from st, failing t when it cannot.
func GetTask(t testing.TB, st *store.Store, id string) *store.Task {
	t.Helper()
	tk, err := st.GetTask(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// Hook is one request a Receiver got.
type Hook struct {
	ID        string // the webhook-id header
	Body      string
	VerifyErr error // the official library's verdict on the signature: nil when it verified
	Status    int   // what the Receiver answered
}

// Receiver is an app's webhook endpoint: it verifies every request with the official Standard
// Webhooks library and answers the status Schedule gives the nth request (1-based), 204 without
// one. Set its exported fields while no request is in flight.
type Receiver struct {
	Secret   string
	Schedule func(n int) int
	// Arrived, when set, is signalled by each request once it is recorded; Hold, when set, keeps
	// each request from being answered until it is closed.
	Arrived, Hold chan struct{}

	mu    sync.Mutex
	hooks []Hook
	srv   *http.Server
	addr  string
}

// NewReceiver returns a Receiver verifying with secret, serving on a free loopback port until t
// ends.
func NewReceiver(t testing.TB, secret string) *Receiver {
	t.Helper()
	r := &Receiver{Secret: secret}
	r.Start(t, "127.0.0.1:0")
	return r
}

// ServeHTTP records the request and answers it.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	wh, err := standardwebhooks.NewWebhook(r.Secret)
	if err == nil {
		err = wh.Verify(body, req.Header)
	}
	r.mu.Lock()
	status := http.StatusNoContent
	if r.Schedule != nil {
		status = r.Schedule(len(r.hooks) + 1)
	}
	r.hooks = append(r.hooks, Hook{ID: req.Header.Get(webhook.HeaderID), Body: string(body), VerifyErr: err, Status: status})
	r.mu.Unlock()
	if r.Arrived != nil {
		select {
		case r.Arrived <- struct{}{}:
		case <-req.Context().Done(): // the server closed, or the sender gave up: nobody will read
			return
		}
	}
	if r.Hold != nil {
		select {
		case <-r.Hold:
		case <-req.Context().Done():
			return
		}
	}
	w.WriteHeader(status)
}

// Hooks returns every request received so far, oldest first.
func (r *Receiver) Hooks() []Hook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Hook(nil), r.hooks...)
}

// Start serves on addr ("127.0.0.1:0" for any free port) until Stop or until t ends; after Stop
// the same address refuses connections until the next Start.
func (r *Receiver) Start(t testing.TB, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := service.NewServer(r, service.Limits{})
	r.mu.Lock()
	r.srv, r.addr = srv, ln.Addr().String()
	r.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(func() { srv.Close() })
}

// Stop takes the Receiver down: connections to its address are refused from now on.
func (r *Receiver) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.Close()
}

// Addr is the host:port the Receiver serves on, or last served on.
func (r *Receiver) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

// URL is the Receiver's webhook URL, the callback a task names.
func (r *Receiver) URL() string { return "http://" + r.Addr() + "/hooks/genbox" }
