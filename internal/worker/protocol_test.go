package worker

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// startHeld runs h on id in the background with its model call held at gate model's gate, and
// returns when the call is at the gate: release it with the returned func, then read done.
func (b *bundle) startHeld(t *testing.T, h *Handler, id, model string) (release func(), done chan bus.Result) {
	t.Helper()
	gate := b.srv.Block(model)
	done = make(chan bus.Result, 1)
	go func() { done <- h.Handle(context.Background(), msg(id)) }()
	select {
	case <-gate.Entered():
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the model")
	}
	return gate.Release, done
}

// A lease that lapsed while its holder's call runs (its renewals failed, or a step took longer
// than the lease) is renewed by the holder when nobody took it over: no other instance claims
// the task and pays for a second call.
func TestLapsedLeaseRenewed(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "lapsed")
	pol := policy("w1")
	pol.LeaseTTL, pol.RenewEvery = 2*time.Second, 200*time.Millisecond
	release, done := b.startHeld(t, b.handler(pol, chain("m")), "lapsed", "m")
	ctx := context.Background()
	if _, err := b.store.MutateTask(ctx, "lapsed", func(d *store.Task, now time.Time) error {
		past := now.Add(-time.Second) // the lease lapsed: as after two failed renewals
		d.Lease.ExpiresAt = &past
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lapsed lease to be renewed", 5*time.Second, func() bool {
		l := b.get(t, "lapsed").Lease
		return l.HeldBy("w1", 1, time.Now())
	})
	other := b.handler(policy("w2"), chain("m"))
	other.Handle(ctx, msg("lapsed"))
	release()
	<-done
	got := b.get(t, "lapsed")
	if got.State != task.StateSucceeded || got.OutputEpoch != 1 || other.Stats().Claimed != 0 || b.srv.Ledger().Total.Calls != 1 {
		t.Errorf("state %s output epoch %d, other instance claimed %d, %d calls; want one call, the holder's output",
			got.State, got.OutputEpoch, other.Stats().Claimed, b.srv.Ledger().Total.Calls)
	}
}

// A failed renewal is retried within about a second, not at the next tick: with a renewal
// interval more than half the lease, one failure would otherwise let the lease lapse.
func TestFailedRenewalRetriedSoon(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "flaky")
	pol := policy("w1")
	pol.LeaseTTL, pol.RenewEvery = 7*time.Second, 4*time.Second
	release, done := b.startHeld(t, b.handler(pol, chain("m")), "flaky", "m")
	defer func() { release(); <-done }()
	ctx := context.Background()
	claimed := b.get(t, "flaky")
	expiry := *claimed.Lease.ExpiresAt
	// The next renewal fails: the task document cannot be decoded (as a read that errors would).
	ref := b.fs.Collection(store.TasksCollection).Doc("flaky")
	if _, err := ref.Update(ctx, []firestore.Update{{Path: "attempts", Value: "unreadable"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed renewal", 10*time.Second, func() bool { return strings.Contains(b.logs.String(), "lease renewal") })
	if _, err := ref.Update(ctx, []firestore.Update{{Path: "attempts", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	for {
		got := b.get(t, "flaky")
		if got.Lease.ExpiresAt.After(expiry) {
			if got.Lease.Owner != "w1" || got.Lease.Epoch != 1 {
				t.Fatalf("lease %+v, want w1's at epoch 1", got.Lease)
			}
			return
		}
		if time.Now().After(expiry) {
			t.Fatalf("the lease lapsed at %s before the failed renewal was retried", expiry)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A 429 whose RetryInfo asks for longer than the in-process wait reschedules the task no sooner
// than that delay, and spends no attempt: a task rate-limited by tokens per minute waits for its
// quota instead of burning its attempts into the DLQ.
func TestRateLimitHonoursRetryInfo(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const delay = 40 * time.Second // above the client's in-process maximum wait (30 s)
	b.srv.SetResponder(func(r geminitest.Request) geminitest.Reply {
		return geminitest.Reply{Code: http.StatusTooManyRequests, RetryDelay: delay}
	})
	b.task(t, "quota")
	h := b.handler(policy("w1"), chain("m"))
	h.Handle(context.Background(), msg("quota"))
	got := b.get(t, "quota")
	if got.State != task.StateQueued || got.Attempts != 0 || got.Error == nil || got.Error.Code != http.StatusTooManyRequests {
		t.Fatalf("state %s attempts %d error %+v; want queued, no attempt spent, the 429 recorded", got.State, got.Attempts, got.Error)
	}
	if earliest := got.UpdatedAt.Add(delay - 2*time.Second); got.NotBefore == nil || got.NotBefore.Before(earliest) {
		t.Errorf("not_before %v, want no sooner than the server's %s delay (%v)", got.NotBefore, delay, earliest)
	}
	if n := b.srv.Ledger().Total.Calls; n != 1 {
		t.Errorf("%d calls, want 1 (no in-process wait of %s)", n, delay)
	}
}
