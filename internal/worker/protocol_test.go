package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/firestore/apiv1/firestorepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
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
	if _, err := b.store.MutateTask(ctx, "lapsed", func(d *protocol.Task, now time.Time) error {
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
	b.paidOnce(t, "lapsed", other)
}

// paidOnce checks that task id succeeded with the output of its first claim (epoch 1), that other
// never claimed it, and that the model was called once.
func (b *bundle) paidOnce(t *testing.T, id string, other *Handler) {
	t.Helper()
	got := b.get(t, id)
	if claimed := b.outcomes(t, other, obs.WorkerClaimed); got.State != task.StateSucceeded || got.OutputEpoch != 1 || claimed != 0 || b.srv.Ledger().Total.Calls != 1 {
		t.Errorf("state %s output epoch %d, other instance claimed %d, %d calls; want one call, the first holder's output",
			got.State, got.OutputEpoch, claimed, b.srv.Ledger().Total.Calls)
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

// A paid output whose commit fails with a retryable code the client library does not retry
// itself (Internal, Unknown: before, the worker dropped the output at once), and for longer than
// the lease, is held and committed: the renewal keeps the lease while the commit is retried, so
// no other instance claims the task and pays for it again. (ResourceExhausted and Unavailable
// reach the worker only once the library's own retries of the commit gave up.)
func TestOutputHeldThroughCommitFailures(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.Internal, codes.Unknown} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var until time.Time // output commits fail until then
			b := setupFaulty(t, func(req any) error {
				c, ok := req.(*firestorepb.CommitRequest)
				if !ok {
					return nil
				}
				for _, w := range c.Writes {
					if _, output := w.GetUpdate().GetFields()["output_at"]; output {
						mu.Lock()
						defer mu.Unlock()
						if time.Now().Before(until) {
							return status.Error(code, "injected: the service is struggling")
						}
					}
				}
				return nil
			})
			b.task(t, "held")
			pol := policy("w1")
			pol.LeaseTTL, pol.RenewEvery, pol.CommitRetry = 1500*time.Millisecond, 300*time.Millisecond, time.Minute
			release, done := b.startHeld(t, b.handler(pol, chain("m")), "held", "m")
			mu.Lock()
			until = time.Now().Add(2 * pol.LeaseTTL) // outlasts the lease the claim took
			mu.Unlock()
			release()
			other := b.handler(policy("w2"), chain("m"))
			for held := true; held; {
				select {
				case <-done:
					held = false
				case <-time.After(200 * time.Millisecond):
					other.Handle(context.Background(), msg("held")) // a sweep's nudge meanwhile
				}
			}
			b.paidOnce(t, "held", other)
		})
	}
}

// A zombie of a replay that a Regenerate ended answers after the new replay's output: its spend
// is charged to its own replay's previous[] entry, and the new replay's usage is its own calls'.
func TestZombieOfAnEarlierReplayChargesItsReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "zr")
	_, releaseZombie, zdone := b.zombie(t, "zr") // replay 0, epoch 1, its call held
	if _, err := b.store.MutateTask(context.Background(), "zr", func(d *protocol.Task, now time.Time) error {
		d.Error = &protocol.TaskError{Kind: task.KindCrash, Message: "lease lost"}
		d.Finish(task.StateDead, now) // as past the claim cap, then an approver's Regenerate
		d.Regenerate()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := b.handler(policy("new"), chain("mn")).Handle(context.Background(), msg("zr")); r != bus.Ack {
		t.Fatalf("new owner: %v", r)
	}
	releaseZombie()
	<-zdone
	got := b.get(t, "zr")
	l := b.srv.Ledger()
	if got.State != task.StateSucceeded || got.Replay != 1 || got.OutputEpoch != 2 {
		t.Fatalf("state %s replay %d output epoch %d; want replay 1's output", got.State, got.Replay, got.OutputEpoch)
	}
	if got.Usage != l.Model("mn").Billed {
		t.Errorf("replay 1 usage %+v, want its own call's %+v (the zombie's %+v is replay 0's)", got.Usage, l.Model("mn").Billed, l.Model("mz").Billed)
	}
	if len(got.Previous) != 1 || got.Previous[0].Usage != l.Model("mz").Billed {
		t.Errorf("previous %+v, want replay 0 charged the zombie's %+v", got.Previous, l.Model("mz").Billed)
	}
	if got.ModelCalls != 2 {
		t.Errorf("model calls %d, want both recorded", got.ModelCalls)
	}
}

// Every code a commit can fail with and pass on a retry is retried; what the commit decided
// (a missing task, the transaction function's own error) is not.
func TestRetryableCommitErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "x"), true},
		{status.Error(codes.DeadlineExceeded, "x"), true},
		{status.Error(codes.Aborted, "x"), true},
		{status.Error(codes.ResourceExhausted, "x"), true},
		{status.Error(codes.Internal, "x"), true},
		{status.Error(codes.Unknown, "x"), true},
		{fmt.Errorf("mutate task t: %w", status.Error(codes.Internal, "x")), true},
		{context.DeadlineExceeded, true},
		{status.Error(codes.InvalidArgument, "x"), false},
		{status.Error(codes.FailedPrecondition, "x"), false},
		{status.Error(codes.PermissionDenied, "x"), false},
		{fmt.Errorf("mutate task t: %w", store.ErrNotFound), false},
		{errors.New("decode task t: bad field"), false},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// The ack-deadline extension covers the longest a task message can be held: every attempt of the
// call at its timeout, a backoff before each retry, then the commit retry. Unset, it is derived
// from those settings; set shorter, the configuration is refused naming it.
func TestMaxExtensionCoversTheLongestHold(t *testing.T) {
	t.Parallel()
	base := map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:1"}
	env := func(extra map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
	}
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	// The defaults: 8 attempts of 2m, 7 waits of at most 30s (GENBOX_MAX_RETRY_WAIT over a 20s
	// GENBOX_BACKOFF_MAX), then 10m of commit retry.
	if want := 8*2*time.Minute + 7*30*time.Second + 10*time.Minute; c.MaxExtension < want {
		t.Errorf("default max extension %s, want at least %s", c.MaxExtension, want)
	}
	c, err = FromEnv(env(map[string]string{"GENBOX_CALL_TIMEOUT": "10s", "GENBOX_MAX_ATTEMPTS": "2", "GENBOX_COMMIT_RETRY": "1m"}))
	if want := 2*10*time.Second + 30*time.Second + time.Minute; err != nil || c.MaxExtension != want {
		t.Errorf("derived max extension %s (%v), want %s from the call settings", c.MaxExtension, err, want)
	}
	if _, err := FromEnv(env(map[string]string{"GENBOX_MAX_EXTENSION": "15m"})); err == nil || !strings.Contains(err.Error(), "GENBOX_MAX_EXTENSION") {
		t.Errorf("15m against the default settings: %v, want an error naming GENBOX_MAX_EXTENSION", err)
	}
	if c, err := FromEnv(env(map[string]string{"GENBOX_MAX_EXTENSION": "1h"})); err != nil || c.MaxExtension != time.Hour {
		t.Errorf("1h: %s %v, want accepted", c.MaxExtension, err)
	}
}
