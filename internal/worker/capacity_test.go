package worker

import (
	"context"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"cloud.google.com/go/firestore/apiv1/firestorepb"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A model-call slot is held only while the call runs: with one slot, a task whose output commit
// is stuck does not keep the next task from calling the model, committing and being acked. The
// stuck output is still committed before its own ack.
func TestSlotFreedBeforeTheOutputCommit(t *testing.T) {
	t.Parallel()
	stuck, unstick := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := setupFaulty(t, func(req any) error {
		c, ok := req.(*firestorepb.CommitRequest)
		if !ok {
			return nil
		}
		for _, w := range c.Writes {
			if _, output := w.GetUpdate().GetFields()["output_at"]; output && strings.HasSuffix(w.GetUpdate().GetName(), "/tasks/stuck") {
				once.Do(func() { close(stuck) })
				<-unstick
			}
		}
		return nil
	})
	defer func() {
		select {
		case <-unstick:
		default:
			close(unstick)
		}
	}()
	b.task(t, "stuck")
	b.task(t, "next")
	h := New(b.store, b.gen, chain("m"), b.pub, b.log, policy("w"), WithCapacity(1, 0, 2))
	acked := make(chan bus.Result, 1)
	go func() { acked <- h.Handle(context.Background(), msg("stuck")) }()
	select {
	case <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the first task's output commit never started")
	}
	nextDone := make(chan bus.Result, 1)
	go func() { nextDone <- h.Handle(context.Background(), msg("next")) }()
	select {
	case <-nextDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the next task never finished while the first one's commit was stuck: its commit held the only slot")
	}
	if got := b.get(t, "next"); got.State != task.StateSucceeded {
		t.Errorf("the next task is %s, want succeeded", got.State)
	}
	select {
	case r := <-acked:
		t.Fatalf("the stuck task was answered %v before its output was committed", r)
	default:
	}
	close(unstick)
	if r := <-acked; r != bus.Ack {
		t.Errorf("the stuck task: %v, want ack", r)
	}
	for _, id := range []string{"stuck", "next"} {
		if got := b.get(t, id); got.State != task.StateSucceeded || len(b.srv.Ledger().BillsFor(id)) != 1 {
			t.Errorf("%s is %s, billed %d times; want succeeded, billed once", id, got.State, len(b.srv.Ledger().BillsFor(id)))
		}
	}
}

// A task claimed ahead of a free slot — the reserve — keeps its lease renewed while it waits,
// and releases it, without a call or an attempt counted, when the instance stops taking work. A
// message beyond the reserve is not claimed at all.
func TestReserveRenewedAndReleasedAtShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	gate := b.srv.Block("m")
	defer gate.Release()
	for _, id := range []string{"calling", "reserved", "beyond"} {
		b.task(t, id)
	}
	pol := policy("w")
	h := New(b.store, b.gen, chain("m"), b.pub, b.log, pol, WithCapacity(1, 1, 3))
	pull, stop := context.WithCancel(context.Background())
	results := map[string]chan bus.Result{}
	start := func(id string) {
		results[id] = make(chan bus.Result, 1)
		go func() { results[id] <- h.Handle(pull, msg(id)) }()
	}
	start("calling")
	select {
	case <-gate.Entered():
	case <-time.After(30 * time.Second):
		t.Fatal("the first task never called the model")
	}
	start("reserved")
	waitFor(t, "the reserve's claim", 10*time.Second, func() bool { return b.get(t, "reserved").State == task.StateRunning })
	start("beyond")
	claimed := b.get(t, "reserved").Lease
	time.Sleep(5 * pol.RenewEvery)
	renewed := b.get(t, "reserved").Lease
	if renewed.Owner != "w" || renewed.Epoch != claimed.Epoch || !renewed.ExpiresAt.After(*claimed.ExpiresAt) {
		t.Errorf("the reserve's lease went from %+v to %+v, want it renewed under the same epoch", claimed, renewed)
	}
	if got := b.get(t, "beyond"); got.State != task.StateQueued || got.Lease.Epoch != 0 {
		t.Errorf("the message beyond the reserve: task %s, lease %+v; want it left queued, unclaimed", got.State, got.Lease)
	}

	stop() // the pull stops: shutdown begins
	for _, id := range []string{"reserved", "beyond"} {
		select {
		case r := <-results[id]:
			if r != bus.Ack {
				t.Errorf("%s: %v, want ack", id, r)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s still waiting after the pull stopped", id)
		}
	}
	got := b.get(t, "reserved")
	if got.State != task.StateQueued || got.Lease.Owner != "" || got.Attempts != 0 || got.ModelCalls != 0 {
		t.Errorf("the reserve after shutdown: %s, lease %+v, %d attempts, %d calls; want queued, released, nothing counted",
			got.State, got.Lease, got.Attempts, got.ModelCalls)
	}
	gate.Release() // the call under way still answers and is persisted
	if r := <-results["calling"]; r != bus.Ack {
		t.Errorf("the calling task: %v, want ack", r)
	}
	if got := b.get(t, "calling"); got.State != task.StateSucceeded {
		t.Errorf("the calling task is %s, want succeeded", got.State)
	}
	for _, id := range []string{"reserved", "beyond"} {
		if n := len(b.srv.Ledger().BillsFor(id)); n != 0 {
			t.Errorf("%s billed %d times, want never", id, n)
		}
	}
}

// The reserve and the pull's flow control are sized from the model-call slots unless set: a
// half the slots claimed ahead (at least one), and room in hand for the slots, the reserve
// and as many again finishing after their calls. A reserve of 0 is a setting of its own.
func TestCapacityFromTheSlots(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env           map[string]string
		ahead, inHand int
	}{
		{map[string]string{}, 32, 160},
		{map[string]string{"GENBOX_CONCURRENCY": "2"}, 1, 5},
		{map[string]string{"GENBOX_CONCURRENCY": "8", "GENBOX_CLAIM_AHEAD": "0"}, 0, 16},
		{map[string]string{"GENBOX_CONCURRENCY": "1", "GENBOX_MAX_IN_FLIGHT": "1"}, 1, 1},
	} {
		env := map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:1"}
		maps.Copy(env, c.env)
		cfg, err := FromEnv(func(k string) string { return env[k] })
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if cfg.ClaimAhead != c.ahead || cfg.MaxInFlight != c.inHand {
			t.Errorf("%v: claim ahead %d, in flight %d; want %d, %d", c.env, cfg.ClaimAhead, cfg.MaxInFlight, c.ahead, c.inHand)
		}
	}
}

// A burst of messages claims a quarter of the slots' worth at a time, not every place among the
// claimed at once: the first claims finish first and their calls start, where a burst served side
// by side finished every claim late together. A claim waiting for its turn gives up when the
// instance stops taking work, and its task stays due.
func TestClaimsOfABurstArePaced(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := &Handler{}
		WithCapacity(64, 32, 160)(h)
		pull, stopPulling := context.WithCancel(t.Context())
		var underWay, most atomic.Int32
		release := make(chan struct{})
		claimed := make(chan bool, 96)
		for range 96 {
			go func() {
				p, ok := h.room.enter(pull, true)
				if !ok {
					claimed <- false
					return
				}
				defer p.leave()
				claimed <- p.claim(func() {
					n := underWay.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					<-release
					underWay.Add(-1)
				})
			}()
		}
		synctest.Wait()
		if got, want := underWay.Load(), int32(claimsAtOnce(64)); got != want {
			t.Fatalf("%d claims under way in a burst of 96 with 64 slots, want %d", got, want)
		}
		release <- struct{}{} // one claim ends: one more starts
		synctest.Wait()
		if got := most.Load(); got != int32(claimsAtOnce(64)) {
			t.Errorf("at most %d claims were under way at once, want %d", got, claimsAtOnce(64))
		}
		stopPulling()
		synctest.Wait()
		close(release)
		ran := 0
		for range 96 {
			if <-claimed {
				ran++
			}
		}
		if want := 1 + claimsAtOnce(64); ran != want {
			t.Errorf("%d claims ran, want %d: those under way when pulling stopped, and the one before; the waiting ones give up", ran, want)
		}
	})
}

// Load counts the slots a call holds and, once freed, how long it held one; the places among
// the claimed and in hand are not calls.
func TestLoadCountsCallSlots(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := New(nil, nil, nil, nil, nil, Policy{}, WithCapacity(2, 1, 4))
		ctx := context.Background()
		a, _ := h.room.enter(ctx, false)
		b, _ := h.room.enter(ctx, false)
		if !a.startCall(ctx) || !b.startCall(ctx) {
			t.Fatal("no call slot free")
		}
		if got, want := h.Load(), (autoscale.Load{Slots: 2, Calling: 2}); got != want {
			t.Fatalf("two calls: %+v, want %+v", got, want)
		}
		time.Sleep(3 * time.Second)
		a.endCall()
		a.endCall() // a second end frees nothing more
		time.Sleep(time.Second)
		b.leave()
		if got, want := h.Load(), (autoscale.Load{Slots: 2, Served: 2, Busy: 7 * time.Second}); got != want {
			t.Fatalf("after both: %+v, want %+v", got, want)
		}
		a.leave()
	})
}
