package resulthandler

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

const tenant = "acme"

var _ Publisher = (*testenv.Publisher)(nil)

type env struct {
	ctx     context.Context
	fs      *firestore.Client
	project string
	st      *store.Store
	clock   *testenv.Clock
	recv    *doubles.Receiver
	pub     *testenv.Publisher
	h       *Handler
	policy  Policy
	secret  string
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
	project := emulator.ProjectID(t)
	fs := testenv.Firestore(t, project)
	c := testenv.NewClock(time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC))
	st := store.New(fs)
	st.Now = c.Now
	st.MaxAttempts = 30
	secret := testenv.Tenant(t, st, tenant)
	e := &env{ctx: ctx, fs: fs, project: project, st: st, clock: c, recv: doubles.NewReceiver(t, secret), pub: &testenv.Publisher{}, policy: testPolicy("rh-1"), secret: secret}
	e.h = e.handler(t, e.policy)
	return e
}

// handler returns a Handler on e's store, with its own lease owner.
func (e *env) handler(t testing.TB, p Policy) *Handler {
	t.Helper()
	client := ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true, Timeout: p.Timeout})
	h, err := New(e.st, e.st, e.pub, client, slog.New(slog.DiscardHandler), p)
	if err != nil {
		t.Fatal(err)
	}
	h.Rand = func() float64 { return 1 } // the ceiling: predictable schedules
	return h
}

// finishedTask creates a succeeded task whose task.succeeded webhook is pending to url.
func (e *env) finishedTask(t testing.TB, id, url string) *protocol.Task {
	t.Helper()
	now := e.clock.Now()
	tk := &protocol.Task{ID: id, Tenant: tenant, Family: "summarize", Variant: "default", Input: "x",
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
