// Package doubles holds the doubles of genbox's two outside peers, shared by the tests, the
// chaos suite, `genbox dev` and `genbox bench`: Receiver, an app's webhook endpoint that verifies
// every delivery with the official Standard Webhooks library and records it, and Slack, the Slack
// Web API that the dlqnotifier's slack-go client is pointed at (its API URL option), recording
// every post and update.
package doubles

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/genbox-dev/genbox/internal/service"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

// Hook is one request a Receiver got.
type Hook struct {
	ID        string // the webhook-id header
	Body      string
	VerifyErr error     // the official library's verdict on the signature: nil when it verified
	Status    int       // what the Receiver answered
	At        time.Time // when it arrived
}

// Accepted reports whether the hook verified and was answered 2xx: delivered, as genbox sees it.
func (h Hook) Accepted() bool { return h.VerifyErr == nil && h.Status/100 == 2 }

// Event decodes the body as a genbox event; a body that is not one gives the zero Event.
func (h Hook) Event() task.Event {
	var ev task.Event
	_ = json.Unmarshal([]byte(h.Body), &ev)
	return ev
}

// relistenFor bounds how long Listen retries an address that is still held (by the server a
// Stop just closed).
const relistenFor = 10 * time.Second

// Receiver is an app's webhook endpoint: it verifies every request with the official Standard
// Webhooks library, records it, and answers 204 when it verified and 401 when not — or what
// Respond or Schedule say. Set its exported fields before it serves, or while no request is in
// flight.
type Receiver struct {
	Secret string
	// Schedule, when set, gives the status of the nth request (1-based), verified or not.
	Schedule func(n int) int
	// Respond, when set, answers every request instead (its body readable again): its answer is
	// recorded, then sent.
	Respond http.Handler
	// Arrived, when set, is signalled by each request once it is recorded; Hold, when set, keeps
	// each request from being answered until it is closed.
	Arrived, Hold chan struct{}
	// Answered, when set, is called with each hook once its answer has been flushed to the sender.
	Answered func(Hook)

	got record[Hook]

	mu        sync.Mutex
	n         int
	delivered map[string][]Hook        // the accepted hooks of each webhook-id
	waiters   map[string]chan struct{} // closed on the first accepted hook of a webhook-id
	srv       *http.Server
	addr      string
}

var _ http.Handler = (*Receiver)(nil)

// New returns a Receiver verifying with secret; serve it with Listen or as any http.Handler.
func New(secret string) *Receiver {
	return &Receiver{Secret: secret}
}

// NewReceiver returns a Receiver verifying with secret, serving on a free loopback port until t
// ends.
func NewReceiver(t testing.TB, secret string) *Receiver {
	t.Helper()
	r := New(secret)
	r.Start(t, "127.0.0.1:0")
	return r
}

// ServeHTTP records the request and answers it.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(io.LimitReader(req.Body, webhook.MaxBodyBytes))
	wh, err := standardwebhooks.NewWebhook(r.Secret)
	if err == nil {
		err = wh.Verify(body, req.Header)
	}
	var answer *httptest.ResponseRecorder
	if r.Respond != nil {
		answer = httptest.NewRecorder()
		req.Body = io.NopCloser(bytes.NewReader(body))
		r.Respond.ServeHTTP(answer, req)
	}
	r.mu.Lock()
	r.n++
	status := http.StatusNoContent
	switch {
	case answer != nil:
		status = answer.Code
	case r.Schedule != nil:
		status = r.Schedule(r.n)
	case err != nil:
		status = http.StatusUnauthorized
	}
	h := Hook{ID: req.Header.Get(webhook.HeaderID), Body: string(body), VerifyErr: err, Status: status, At: at}
	r.got.add(h)
	if h.Accepted() {
		if r.delivered == nil {
			r.delivered = map[string][]Hook{}
		}
		r.delivered[h.ID] = append(r.delivered[h.ID], h)
		if ch, ok := r.waiters[h.ID]; ok && len(r.delivered[h.ID]) == 1 {
			close(ch)
		}
	}
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
	if answer != nil {
		for k, vs := range answer.Header() {
			w.Header()[k] = vs
		}
		w.WriteHeader(answer.Code)
		_, _ = w.Write(answer.Body.Bytes())
	} else {
		w.WriteHeader(status)
	}
	if r.Answered != nil {
		_ = http.NewResponseController(w).Flush() // the answer is on its way before Answered runs
		r.Answered(h)
	}
}

// Hooks returns every request received so far, oldest first.
func (r *Receiver) Hooks() []Hook { return r.got.all() }

// Wait returns the first request match accepts, waiting for it until ctx ends.
func (r *Receiver) Wait(ctx context.Context, match func(Hook) bool) (Hook, error) {
	return r.got.wait(ctx, match)
}

// Deliveries returns the accepted hooks of webhook-id id, oldest first: more than one is a
// duplicate the app had to dedupe.
func (r *Receiver) Deliveries(id string) []Hook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Hook(nil), r.delivered[id]...)
}

// Delivered returns a channel closed once a hook of webhook-id id has been accepted.
func (r *Receiver) Delivered(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiters == nil {
		r.waiters = map[string]chan struct{}{}
	}
	ch, ok := r.waiters[id]
	if !ok {
		ch = make(chan struct{})
		r.waiters[id] = ch
		if len(r.delivered[id]) > 0 {
			close(ch)
		}
	}
	return ch
}

// Tally returns the distinct webhook-ids accepted, the accepted hooks beyond the first of each,
// and the requests that failed verification.
func (r *Receiver) Tally() (distinct, duplicates, unverified int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, hs := range r.delivered {
		distinct++
		duplicates += len(hs) - 1
	}
	for _, h := range r.got.all() {
		if h.VerifyErr != nil {
			unverified++
		}
	}
	return distinct, duplicates, unverified
}

// Listen serves on addr ("127.0.0.1:0" for any free port) until Stop; an address still held by
// the server a Stop just closed is retried for a few seconds.
func (r *Receiver) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	for deadline := time.Now().Add(relistenFor); err != nil && errors.Is(err, syscall.EADDRINUSE) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		return err
	}
	srv := service.NewServer(r, service.Limits{})
	r.mu.Lock()
	r.srv, r.addr = srv, ln.Addr().String()
	r.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	return nil
}

// Start is Listen failing t, with a Stop when t ends.
func (r *Receiver) Start(t testing.TB, addr string) {
	t.Helper()
	if err := r.Listen(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
}

// Stop takes the Receiver down: connections to its address are refused from now on.
func (r *Receiver) Stop() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Addr is the host:port the Receiver serves on, or last served on.
func (r *Receiver) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

// URL is the Receiver's webhook URL, the callback a task names.
func (r *Receiver) URL() string { return "http://" + r.Addr() + "/hooks/genbox" }
