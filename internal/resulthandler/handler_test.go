package resulthandler

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/doubles"
	"github.com/genbox-dev/genbox/internal/ssrf"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// checkPosts asserts every post verified with the official library and carried id.
func checkPosts(t *testing.T, posts []doubles.Hook, ids ...string) {
	t.Helper()
	if len(posts) != len(ids) {
		t.Fatalf("%d posts, want %d: %+v", len(posts), len(ids), posts)
	}
	for i, p := range posts {
		if p.VerifyErr != nil {
			t.Errorf("post %d does not verify with the official library: %v", i, p.VerifyErr)
		}
		if p.ID != ids[i] {
			t.Errorf("post %d webhook-id %q, want %q", i, p.ID, ids[i])
		}
	}
}

func TestRetryThenDelivered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recv.Schedule = func(n int) int {
		if n == 1 {
			return 500
		}
		return 200
	}
	tk := e.finishedTask(t, "t-retry", e.recv.URL())
	evID := task.EventID(tk.ID, task.EventSucceeded, 0)

	if r := e.handle(tk.ID); r != bus.Ack {
		t.Fatalf("result %v", r)
	}
	got := testenv.GetTask(t, e.st, tk.ID)
	d := got.Delivery
	if d.State != task.DeliveryPending || d.Attempts != 1 || d.LastStatus != 500 || d.Lease.Owner != "" {
		t.Fatalf("after a 500: %+v", d)
	}
	if want := e.clock.Now().Add(e.policy.BackoffMin); d.NextAttemptAt == nil || !d.NextAttemptAt.Equal(want) {
		t.Fatalf("next_attempt_at %v, want %v", d.NextAttemptAt, want)
	}
	if got.DueAt == nil || !got.DueAt.Equal(*d.NextAttemptAt) {
		t.Fatalf("due_at %v, want next_attempt_at %v", got.DueAt, d.NextAttemptAt)
	}

	e.handle(tk.ID) // not due yet: nothing happens
	if n := len(e.recv.Hooks()); n != 1 {
		t.Fatalf("%d posts before next_attempt_at", n)
	}

	e.clock.Set(*d.NextAttemptAt)
	e.handle(tk.ID)
	got = testenv.GetTask(t, e.st, tk.ID)
	d = got.Delivery
	if d.State != task.DeliveryDelivered || d.DeliveredAt == nil || d.Attempts != 2 || d.LastStatus != 200 {
		t.Fatalf("after a 200: %+v", d)
	}
	if got.State != task.StateSucceeded {
		t.Fatalf("task state %s changed", got.State)
	}
	if got.DueAt != nil || got.ExpireAt == nil {
		t.Fatalf("nothing pending, yet due_at %v expire_at %v", got.DueAt, got.ExpireAt)
	}
	if len(d.Log) != 2 || d.Log[0].Status != 500 || d.Log[1].Status != 200 || d.Log[0].EventID != evID {
		t.Fatalf("log %+v", d.Log)
	}
	posts := e.recv.Hooks()
	checkPosts(t, posts, evID, evID)
	var ev task.Event
	if err := json.Unmarshal([]byte(posts[1].Body), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != task.EventSucceeded || ev.Data.TaskID != tk.ID || ev.Data.Output == nil || *ev.Data.Output != "a summary" {
		t.Fatalf("payload %+v", ev)
	}
	if posts[0].Body != posts[1].Body {
		t.Fatal("the retry sent another payload than the frozen one")
	}
	if len(e.pub.All()) != 0 {
		t.Fatalf("published %+v", e.pub.All())
	}
}

func TestClientErrorIsDeadAtOnce(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 404, 410, 302} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.recv.Schedule = func(int) int { return status }
			tk := e.finishedTask(t, "t-dead", e.recv.URL())
			e.handle(tk.ID)
			got := testenv.GetTask(t, e.st, tk.ID)
			d := got.Delivery
			if d.State != task.DeliveryDead || d.Attempts != 1 || d.LastStatus != status || d.NextAttemptAt != nil || d.Lease.Owner != "" {
				t.Fatalf("delivery %+v", d)
			}
			if got.State != task.StateSucceeded {
				t.Fatalf("task state %s changed", got.State)
			}
			if len(got.Notices) != 1 || got.Notices[0].Stage != task.StageDelivery || got.Notices[0].Round != 0 {
				t.Fatalf("notices %+v", got.Notices)
			}
			want := e.clock.Now().Add(e.policy.NoticeGrace)
			if got.DueAt == nil || !got.DueAt.Equal(want) {
				t.Fatalf("due_at %v, want the notice's %v", got.DueAt, want)
			}
			msgs := e.pub.All()
			if len(msgs) != 1 || msgs[0].Topic != bus.TopicResultsDLQ {
				t.Fatalf("published %+v", msgs)
			}
			a := msgs[0].Attrs
			if a[task.AttrTaskID] != tk.ID || a[task.AttrStage] != "delivery" || a[task.AttrReplay] != "0" || a[task.AttrRound] != "0" || a[task.AttrKind] != "notice" {
				t.Fatalf("attributes %v", a)
			}
			e.clock.Set(e.clock.Now().Add(time.Hour))
			e.handle(tk.ID)
			if n := len(e.recv.Hooks()); n != 1 {
				t.Fatalf("%d posts: a dead delivery was retried", n)
			}
		})
	}
}

// drive handles the task, then moves the clock to its next attempt, until the delivery is no
// longer pending (or n rounds).
func (e *env) drive(t *testing.T, id string, n int, before func(i int)) *protocol.Task {
	t.Helper()
	for i := range n {
		if before != nil {
			before(i)
		}
		e.handle(id)
		got := testenv.GetTask(t, e.st, id)
		if got.Delivery.State != task.DeliveryPending {
			return got
		}
		if got.Delivery.NextAttemptAt == nil {
			t.Fatalf("pending without next_attempt_at: %+v", got.Delivery)
		}
		e.clock.Set(*got.Delivery.NextAttemptAt)
	}
	t.Fatalf("still pending after %d rounds", n)
	return nil
}

func TestReceiverDownPastHorizonIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recv.Stop() // connection refused from now on
	tk := e.finishedTask(t, "t-down", e.recv.URL())
	start := e.clock.Now()
	got := e.drive(t, tk.ID, 20, nil)
	d := got.Delivery
	if d.State != task.DeliveryDead {
		t.Fatalf("delivery %+v", d)
	}
	if !strings.Contains(d.LastError, "horizon") {
		t.Fatalf("last error %q", d.LastError)
	}
	last := d.Log[len(d.Log)-1].At
	if !last.Equal(start.Add(e.policy.Horizon)) {
		t.Fatalf("last attempt at %v, want the horizon %v", last, start.Add(e.policy.Horizon))
	}
	if d.FirstAttemptAt == nil || !d.FirstAttemptAt.Equal(start) || d.Attempts != len(d.Log) || d.Attempts < 4 {
		t.Fatalf("first attempt %v, attempts %d, log %d", d.FirstAttemptAt, d.Attempts, len(d.Log))
	}
	for _, a := range d.Log {
		if a.Status != 0 || !strings.Contains(a.Error, "refused") {
			t.Fatalf("attempt %+v is not a connection error", a)
		}
	}
	if len(got.Notices) != 1 || len(e.pub.All()) != 1 {
		t.Fatalf("notices %+v, published %+v", got.Notices, e.pub.All())
	}
}

func TestReceiverBackBeforeHorizonDeliversOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	addr := e.recv.Addr()
	e.recv.Stop()
	tk := e.finishedTask(t, "t-back", e.recv.URL())
	got := e.drive(t, tk.ID, 20, func(i int) {
		if i == 3 {
			e.recv.Start(t, addr) // back, on the same address
		}
	})
	if got.Delivery.State != task.DeliveryDelivered || got.Delivery.Attempts != 4 {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	evID := task.EventID(tk.ID, task.EventSucceeded, 0)
	checkPosts(t, e.recv.Hooks(), evID)
	e.clock.Set(e.clock.Now().Add(time.Hour))
	e.handle(tk.ID)
	checkPosts(t, e.recv.Hooks(), evID) // still exactly one
}

func TestTwoInstancesOnePOST(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recv.Hold = make(chan struct{})
	e.recv.Arrived = make(chan struct{}, 4)
	tk := e.finishedTask(t, "t-race", e.recv.URL())
	other := e.handler(t, testPolicy("rh-2"))
	msg := &bus.Message{ID: "m", Attributes: map[string]string{task.AttrTaskID: tk.ID}}

	var wg sync.WaitGroup
	start := make(chan struct{})
	done := make(chan string, 2)
	for name, h := range map[string]*Handler{"rh-1": e.h, "rh-2": other} {
		wg.Go(func() {
			<-start
			h.Handle(e.ctx, msg)
			done <- name
		})
	}
	close(start)
	<-e.recv.Arrived // one instance is inside the POST, holding the lease
	loser := <-done  // the other has given up without posting
	close(e.recv.Hold)
	wg.Wait()
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.Delivery.State != task.DeliveryDelivered || got.Delivery.Attempts != 1 {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	if len(e.recv.Hooks()) != 1 {
		t.Fatalf("%d posts, want 1", len(e.recv.Hooks()))
	}
	if got.Delivery.Lease.Epoch != 1 {
		t.Fatalf("lease epoch %d: claimed more than once", got.Delivery.Lease.Epoch)
	}
	t.Logf("%s lost the claim", loser)
}

// One instance never POSTs an event twice at once. A nudge that reaches the instance already
// delivering the task's webhook — here after the delivery lease lapsed during the POST, as when the
// commits around it wait out contention — is acked without a claim, where a claim would take the
// delivery over and POST the event a second time.
func TestDuplicateNudgeInTheSameInstanceAcked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recv.Hold = make(chan struct{})
	e.recv.Arrived = make(chan struct{}, 4)
	release := sync.OnceFunc(func() { close(e.recv.Hold) })
	t.Cleanup(release)
	tk := e.finishedTask(t, "t-dup", e.recv.URL())
	first := make(chan bus.Result, 1)
	go func() { first <- e.handle(tk.ID) }()
	<-e.recv.Arrived
	e.clock.Set(e.clock.Now().Add(e.policy.LeaseTTL() + time.Second)) // the lease lapses mid-POST
	dup := make(chan bus.Result, 1)
	go func() { dup <- e.handle(tk.ID) }()
	select {
	case r := <-dup:
		if r != bus.Ack {
			t.Fatalf("duplicate: %v, want ack", r)
		}
	case <-e.recv.Arrived:
		t.Fatal("the instance POSTed the event a second time while its first POST was in flight")
	case <-time.After(10 * time.Second):
		t.Fatal("the duplicate nudge was not acked")
	}
	release()
	if r := <-first; r != bus.Ack {
		t.Fatalf("first: %v", r)
	}
	if n := len(e.recv.Hooks()); n != 1 {
		t.Fatalf("%d posts, want 1", n)
	}
	if got := testenv.GetTask(t, e.st, tk.ID); got.Delivery.State != task.DeliveryDelivered || got.Delivery.Lease.Epoch != 1 {
		t.Fatalf("delivery %s lease epoch %d; want delivered by the first claim", got.Delivery.State, got.Delivery.Lease.Epoch)
	}
}

func TestNewerEventQueuesBehindPending(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recv.Schedule = func(n int) int {
		if n == 1 {
			return 503
		}
		return 200
	}
	now := e.clock.Now()
	tk := &protocol.Task{ID: "t-queue", Tenant: tenant, Family: "summarize", Input: "x",
		CallbackURL: e.recv.URL(), State: task.StateRunning, CreatedAt: now}
	tk.Error = &protocol.TaskError{Kind: task.KindTransient, Message: "every attempt failed"}
	tk.Finish(task.StateDead, now)
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	deadID := task.EventID(tk.ID, task.EventDead, 0)
	e.handle(tk.ID) // 503: task.dead stays pending

	// Meanwhile a human regenerates and replay 1 succeeds: its event queues behind.
	_, err := e.st.MutateTask(e.ctx, tk.ID, func(t *protocol.Task, now time.Time) error {
		t.Replay, t.Error = 1, nil
		t.Output, t.OutputAt = "second try", &now
		t.Finish(task.StateSucceeded, now)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.Delivery.EventID != deadID || got.Delivery.State != task.DeliveryPending || len(got.Delivery.Queue) != 1 {
		t.Fatalf("the newer event overwrote the pending one: %+v", got.Delivery)
	}
	e.clock.Set(*got.Delivery.NextAttemptAt)
	e.handle(tk.ID) // task.dead delivered, then task.succeeded started and delivered in the same call
	got = testenv.GetTask(t, e.st, tk.ID)
	okID := task.EventID(tk.ID, task.EventSucceeded, 1)
	if got.Delivery.State != task.DeliveryDelivered || got.Delivery.EventID != okID || len(got.Delivery.Queue) != 0 {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	posts := e.recv.Hooks()
	checkPosts(t, posts, deadID, deadID, okID)
	var ev task.Event
	if err := json.Unmarshal([]byte(posts[1].Body), &ev); err != nil || ev.Type != task.EventDead || ev.Data.State != task.StateDead {
		t.Fatalf("task.dead payload %s (%v)", posts[1].Body, err)
	}
}

func TestRefusedDestinationIsDead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.finishedTask(t, "t-ssrf", "http://10.0.0.1/hook")
	e.handle(tk.ID)
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.Delivery.State != task.DeliveryDead || !strings.Contains(got.Delivery.LastError, ssrf.ReasonPrivate) {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	if len(got.Notices) != 1 || len(e.pub.All()) != 1 {
		t.Fatalf("notices %+v published %+v", got.Notices, e.pub.All())
	}
}

// A receiver answering 200 with a header block past ssrf.MaxResponseHeaderBytes has not
// answered: the attempt fails (and is retried), nothing is read past the cap, and the delivery is
// not recorded as delivered.
func TestHugeResponseHeadersFailTheAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var hits atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		v := strings.Repeat("h", 4<<10)
		for i := range 256 { // 1 MiB of headers
			w.Header().Set("X-Pad-"+strconv.Itoa(i), v)
		}
		w.WriteHeader(http.StatusOK)
	})}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	tk := e.finishedTask(t, "t-huge-headers", "http://"+ln.Addr().String()+"/hook")
	if r := e.handle(tk.ID); r != bus.Ack {
		t.Fatalf("result %v", r)
	}
	d := testenv.GetTask(t, e.st, tk.ID).Delivery
	if hits.Load() != 1 {
		t.Fatalf("the receiver got %d requests, want 1", hits.Load())
	}
	if d.State != task.DeliveryPending || d.Attempts != 1 || d.NextAttemptAt == nil {
		t.Fatalf("delivery %+v, want pending with a retry scheduled after one attempt", d)
	}
	if !strings.Contains(d.LastError, "headers exceeded") {
		t.Fatalf("last error %q, want the header limit", d.LastError)
	}
}

// A lost notice publish leaves the notice on the task, due for the sweeper after the grace.
func TestNoticePublishFailureLeavesOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.pub.SetPublishFunc(func(context.Context, string, []byte, map[string]string) error { return net.ErrClosed })
	e.recv.Schedule = func(int) int { return 422 }
	tk := e.finishedTask(t, "t-lost", e.recv.URL())
	e.handle(tk.ID)
	got := testenv.GetTask(t, e.st, tk.ID)
	if len(got.Notices) != 1 || got.DueAt == nil || !got.DueAt.Equal(*got.Notices[0].NextAttemptAt) {
		t.Fatalf("notices %+v due_at %v", got.Notices, got.DueAt)
	}
}

func TestAckWhenNothingToDo(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, attrs := range []map[string]string{{}, {task.AttrTaskID: "missing"}} {
		if r := e.h.Handle(e.ctx, &bus.Message{Attributes: attrs}); r != bus.Ack {
			t.Fatalf("%v: %v", attrs, r)
		}
	}
	tk := &protocol.Task{ID: "t-none", Tenant: tenant, State: task.StateRunning, CreatedAt: e.clock.Now()}
	tk.Finish(task.StateSucceeded, e.clock.Now()) // no callback: delivery none
	if err := e.st.CreateTask(e.ctx, tk); err != nil {
		t.Fatal(err)
	}
	if r := e.handle(tk.ID); r != bus.Ack || len(e.recv.Hooks()) != 0 {
		t.Fatalf("result %v, posts %d", r, len(e.recv.Hooks()))
	}
}

// Redeliver (the dlqnotifier's button) puts a dead delivery back with round + 1 and a fresh
// horizon: the receiver gets the same webhook-id, so it can dedupe.
func TestRedeliverKeepsWebhookID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recv.Schedule = func(n int) int {
		if n == 1 {
			return 404
		}
		return 200
	}
	tk := e.finishedTask(t, "t-redeliver", e.recv.URL())
	e.handle(tk.ID)
	if got := testenv.GetTask(t, e.st, tk.ID); got.Delivery.State != task.DeliveryDead {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	_, err := e.st.MutateTask(e.ctx, tk.ID, func(t *protocol.Task, now time.Time) error {
		d := &t.Delivery
		d.State, d.Round, d.Attempts, d.FirstAttemptAt, d.NextAttemptAt = task.DeliveryPending, d.Round+1, 0, nil, &now
		t.Notices = nil
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.handle(tk.ID)
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.Delivery.State != task.DeliveryDelivered || got.Delivery.Round != 1 {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	if l := got.Delivery.Log; len(l) != 2 || l[0].Round != 0 || l[1].Round != 1 {
		t.Fatalf("log %+v", l)
	}
	id := task.EventID(tk.ID, task.EventSucceeded, 0)
	checkPosts(t, e.recv.Hooks(), id, id)
}

// failingStore fails the handler's second transaction (the outcome commit), as a process dying
// right after the receiver's 2xx would leave it.
type failingStore struct {
	Store
	calls atomic.Int64
}

func (f *failingStore) MutateTask(ctx context.Context, id string, fn store.MutateFunc) (*protocol.Task, error) {
	if f.calls.Add(1) == 2 {
		return nil, errors.New("process died")
	}
	return f.Store.MutateTask(ctx, id, fn)
}

func (f *failingStore) MutateTaskFrom(ctx context.Context, known *protocol.Task, fn store.MutateFunc) (*protocol.Task, error) {
	if f.calls.Add(1) == 2 {
		return nil, errors.New("process died")
	}
	return f.Store.MutateTaskFrom(ctx, known, fn)
}

// The documented duplicate window: when the delivered commit is lost, the lease expires and the
// event is delivered again — with the same webhook-id — and never before the lease expires.
func TestLostCommitRedeliversSameID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tk := e.finishedTask(t, "t-crash", e.recv.URL())
	crashing, err := New(&failingStore{Store: e.st}, e.st, e.pub, ssrf.NewClient(ssrf.Policy{AllowHTTP: true, AllowLoopback: true}),
		e.h.log, testPolicy("rh-crash"))
	if err != nil {
		t.Fatal(err)
	}
	crashing.Handle(e.ctx, &bus.Message{Attributes: map[string]string{task.AttrTaskID: tk.ID}})
	got := testenv.GetTask(t, e.st, tk.ID)
	if got.Delivery.State != task.DeliveryPending || !got.Delivery.Lease.Live(e.clock.Now()) {
		t.Fatalf("delivery %+v", got.Delivery)
	}
	if got.DueAt == nil || !got.DueAt.Equal(*got.Delivery.Lease.ExpiresAt) {
		t.Fatalf("due_at %v, want the lease expiry %v", got.DueAt, got.Delivery.Lease.ExpiresAt)
	}
	e.handle(tk.ID) // the lease is live: nobody else posts
	if n := len(e.recv.Hooks()); n != 1 {
		t.Fatalf("%d posts under a live lease", n)
	}
	e.clock.Set(*got.Delivery.Lease.ExpiresAt)
	e.handle(tk.ID)
	id := task.EventID(tk.ID, task.EventSucceeded, 0)
	checkPosts(t, e.recv.Hooks(), id, id)
	if got := testenv.GetTask(t, e.st, tk.ID); got.Delivery.State != task.DeliveryDelivered || got.Delivery.Lease.Epoch != 2 {
		t.Fatalf("delivery %+v", got.Delivery)
	}
}
