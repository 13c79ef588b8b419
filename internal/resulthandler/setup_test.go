package resulthandler

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
	"github.com/genbox-dev/genbox/pkg/webhook"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

const tenant = "acme"

// clock is the store's injected clock: tests move it past next_attempt_at instead of waiting.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// post is one request the receiver got.
type post struct {
	ID        string
	Body      string
	VerifyErr error
	Status    int
}

// receiver is a real webhook receiver that verifies every request with the official Standard
// Webhooks library and answers with the status its schedule gives for the nth request (1-based).
type receiver struct {
	secret   string
	schedule func(n int) int
	hold     chan struct{} // when set, requests wait for it to close
	arrived  chan struct{} // when set, each request signals its arrival

	mu    sync.Mutex
	posts []post
	srv   *http.Server
	addr  string
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	wh, err := standardwebhooks.NewWebhook(r.secret)
	if err == nil {
		err = wh.Verify(body, req.Header)
	}
	r.mu.Lock()
	n := len(r.posts) + 1
	status := http.StatusNoContent
	if r.schedule != nil {
		status = r.schedule(n)
	}
	r.posts = append(r.posts, post{ID: req.Header.Get(webhook.HeaderID), Body: string(body), VerifyErr: err, Status: status})
	r.mu.Unlock()
	if r.arrived != nil {
		r.arrived <- struct{}{}
	}
	if r.hold != nil {
		<-r.hold
	}
	w.WriteHeader(status)
}

func (r *receiver) Posts() []post {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]post(nil), r.posts...)
}

// start serves on addr ("127.0.0.1:0" for any port); stop takes it down, so the same address
// refuses connections until the next start.
func (r *receiver) start(t testing.TB, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.srv, r.addr = &http.Server{Handler: r}, ln.Addr().String()
	srv := r.srv
	r.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with stop
	t.Cleanup(func() { srv.Close() })
}

func (r *receiver) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.Close()
}

func (r *receiver) URL() string { return "http://" + r.addr + "/hooks/genbox" }

var _ Publisher = (*testenv.Publisher)(nil)

type env struct {
	ctx    context.Context
	fs     *firestore.Client
	st     *store.Store
	clock  *clock
	recv   *receiver
	pub    *testenv.Publisher
	h      *Handler
	policy Policy
	secret string
}

func testPolicy(owner string) Policy {
	return Policy{
		Owner: owner, Timeout: 2 * time.Second, Horizon: time.Minute,
		BackoffMin: time.Second, BackoffMax: 10 * time.Second, NoticeGrace: time.Minute, LogEntries: 20,
	}
}

func setup(t testing.TB) *env {
	t.Helper()
	ctx := context.Background()
	fs := testenv.Firestore(t, emulator.ProjectID(t))
	c := &clock{t: time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)}
	st := store.New(fs)
	st.Now = c.Now
	st.MaxAttempts = 30
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateTenant(ctx, tenant, store.DefaultLimits(), secret); err != nil {
		t.Fatal(err)
	}
	e := &env{ctx: ctx, fs: fs, st: st, clock: c, recv: &receiver{secret: secret}, pub: &testenv.Publisher{}, policy: testPolicy("rh-1"), secret: secret}
	e.recv.start(t, "127.0.0.1:0")
	e.h = e.handler(t, e.policy)
	return e
}

// handler returns a Handler on e's store, with its own lease owner.
func (e *env) handler(t testing.TB, p Policy) *Handler {
	t.Helper()
	client := ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true, Timeout: p.Timeout})
	h, err := New(e.st, e.st, e.pub, client, slog.New(slog.NewTextHandler(io.Discard, nil)), p)
	if err != nil {
		t.Fatal(err)
	}
	h.Jitter = func(d time.Duration) time.Duration { return d } // the ceiling: predictable schedules
	return h
}

// finishedTask creates a succeeded task whose task.succeeded webhook is pending to url.
func (e *env) finishedTask(t testing.TB, id, url string) *store.Task {
	t.Helper()
	now := e.clock.Now()
	tk := &store.Task{ID: id, Tenant: tenant, Family: "summarize", Variant: "default", Input: "x",
		CallbackURL: url, State: task.StateRunning, CreatedAt: now}
	tk.Output, tk.OutputAt = "a summary", &now
	tk.Finish(task.StateSucceeded, now)
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

func (e *env) handle(id string) bus.Result {
	return e.h.Handle(e.ctx, &bus.Message{ID: "m", Attributes: map[string]string{task.AttrTaskID: id}})
}

func (e *env) get(t testing.TB, id string) *store.Task {
	t.Helper()
	tk, err := e.st.GetTask(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}
