package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

func ptr[T any](v T) *T { return &v }

func TestClaimRules(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	now := time.Now().UTC()
	h := b.handler(policy("w1"), chain("m"))
	tests := []struct {
		name       string
		doc        func(*protocol.Task)
		want       claimOutcome
		wantState  task.State
		wantEpoch  int64
		wantClaims int
	}{
		{"queued", func(*protocol.Task) {}, claimed, task.StateRunning, 1, 0},
		{"queued, not_before passed", func(d *protocol.Task) { d.NotBefore = ptr(now.Add(-time.Second)) }, claimed, task.StateRunning, 1, 0},
		{"queued, backing off", func(d *protocol.Task) { d.NotBefore = ptr(now.Add(time.Hour)) }, claimNot, task.StateQueued, 0, 0},
		{"waiting, due", func(d *protocol.Task) { d.State = task.StateWaiting }, claimed, task.StateRunning, 1, 0},
		{"waiting, parked", func(d *protocol.Task) { d.State, d.NotBefore = task.StateWaiting, ptr(now.Add(time.Hour)) }, claimNot, task.StateWaiting, 0, 0},
		{"running, live lease", func(d *protocol.Task) {
			d.State, d.Lease = task.StateRunning, claim.Lease{Owner: "w0", Epoch: 3, ExpiresAt: ptr(now.Add(time.Hour))}
		}, claimNot, task.StateRunning, 3, 0},
		{"running, expired lease: takeover", func(d *protocol.Task) {
			d.State, d.Lease = task.StateRunning, claim.Lease{Owner: "w0", Epoch: 3, ExpiresAt: ptr(now.Add(-time.Second))}
		}, claimed, task.StateRunning, 4, 1},
		{"running, expired past the claim cap", func(d *protocol.Task) {
			d.State, d.Claims = task.StateRunning, 2
			d.Lease = claim.Lease{Owner: "w0", Epoch: 3, ExpiresAt: ptr(now.Add(-time.Second))}
		}, claimDead, task.StateDead, 3, 3},
		{"run_before passed", func(d *protocol.Task) { d.RunBefore = ptr(now.Add(-time.Second)) }, claimExpired, task.StateFailed, 0, 0},
		{"parked past its run_before", func(d *protocol.Task) {
			d.State, d.NotBefore, d.RunBefore = task.StateWaiting, ptr(now.Add(time.Hour)), ptr(now.Add(-time.Second))
		}, claimExpired, task.StateFailed, 0, 0},
		{"succeeded", func(d *protocol.Task) { d.State = task.StateSucceeded }, claimNot, task.StateSucceeded, 0, 0},
		{"cancelled", func(d *protocol.Task) { d.State = task.StateCancelled }, claimNot, task.StateCancelled, 0, 0},
		{"dead", func(d *protocol.Task) { d.State = task.StateDead }, claimNot, task.StateDead, 0, 0},
	}
	for i, tc := range tests {
		id := "claim-" + string(rune('a'+i))
		b.task(t, id, tc.doc)
		c, err := h.claim(context.Background(), id, "")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := b.get(t, id)
		if c.outcome != tc.want || got.State != tc.wantState || got.Lease.Epoch != tc.wantEpoch || got.Claims != tc.wantClaims {
			t.Errorf("%s: outcome %v state %s epoch %d claims %d; want %v %s %d %d", tc.name, c.outcome, got.State, got.Lease.Epoch, got.Claims, tc.want, tc.wantState, tc.wantEpoch, tc.wantClaims)
		}
		if tc.want == claimed && (got.Lease.Owner != "w1" || !got.Lease.Live(time.Now())) {
			t.Errorf("%s: lease %+v not held by w1", tc.name, got.Lease)
		}
		if tc.want == claimDead && (len(got.Notices) != 1 || got.Error == nil || got.Error.Kind != task.KindCrash || got.Delivery.EventType != task.EventDead) {
			t.Errorf("%s: dead task without its notice, crash error or task.dead event: %+v", tc.name, got)
		}
		if tc.want == claimExpired && (got.Error == nil || got.Error.Kind != task.KindExpired) {
			t.Errorf("%s: error %+v, want expired", tc.name, got.Error)
		}
		if tc.want == claimDead || tc.want == claimExpired {
			heldOff(t, got, policy("w1").DeliveryLease)
		}
	}
	if c, err := h.claim(context.Background(), "missing", ""); err != nil || c.outcome != claimNot {
		t.Errorf("missing task: %v %v, want not claimed", c.outcome, err)
	}
	if n := b.srv.Ledger().Total.Calls; n != 0 {
		t.Errorf("claims made %d model calls", n)
	}
}

func TestHandleStoresOutputThenNudges(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "ok")
	h := b.handler(policy("w1"), chain("m"))
	if r := h.Handle(context.Background(), msg("ok")); r != bus.Ack {
		t.Fatalf("result %v", r)
	}
	got := b.get(t, "ok")
	if got.State != task.StateSucceeded || !got.HasOutput() || got.Output == "" || got.OutputEpoch != 1 {
		t.Fatalf("task %s output %q epoch %d; want succeeded with output of epoch 1", got.State, got.Output, got.OutputEpoch)
	}
	if got.Usage.TotalTokens == 0 || got.ModelCalls != 1 || got.Model != "m" || got.Lease.Owner != "" || got.NotBefore != nil {
		t.Errorf("usage %+v calls %d model %q lease %+v not_before %v", got.Usage, got.ModelCalls, got.Model, got.Lease, got.NotBefore)
	}
	if got.Delivery.State != task.DeliveryPending || got.Delivery.EventID != task.EventID("ok", task.EventSucceeded, 0) {
		t.Errorf("delivery %+v; want task.succeeded pending", got.Delivery)
	}
	if got.Usage != b.srv.Ledger().BilledFor("ok") {
		t.Errorf("recorded usage %+v, billed %+v", got.Usage, b.srv.Ledger().BilledFor("ok"))
	}
	res := b.pub.On(bus.TopicResults)
	if len(res) != 1 || res[0].Attrs[task.AttrTaskID] != "ok" {
		t.Errorf("result nudges %+v", res)
	}
	if n := b.count(t, h, obs.MetricPaidWindow); n != 1 {
		t.Errorf("%d paid windows recorded, want 1", n)
	}
	// A duplicate after success is acked without a call.
	if r := h.Handle(context.Background(), msg("ok")); r != bus.Ack || b.srv.Ledger().Total.Calls != 1 {
		t.Errorf("duplicate: %v, %d calls", r, b.srv.Ledger().Total.Calls)
	}
}

// Two workers receive the same task at once: exactly one model call, both ack, nothing dead.
func TestDuplicateDeliveryOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, 300*time.Millisecond)
	for _, id := range []string{"dup-1", "dup-2", "dup-3"} {
		b.task(t, id)
	}
	h1, h2 := b.handler(policy("w1"), chain("m")), b.handler(policy("w2"), chain("m"))
	var wg sync.WaitGroup
	results := make(chan bus.Result, 6)
	for _, id := range []string{"dup-1", "dup-2", "dup-3"} {
		for _, h := range []*Handler{h1, h2} {
			wg.Go(func() { results <- h.Handle(context.Background(), msg(id)) })
		}
	}
	wg.Wait()
	close(results)
	for r := range results {
		if r != bus.Ack {
			t.Errorf("result %v, want ack", r)
		}
	}
	for _, id := range []string{"dup-1", "dup-2", "dup-3"} {
		if n := len(b.srv.Ledger().BillsFor(id)); n != 1 {
			t.Errorf("%s billed %d times", id, n)
		}
		if got := b.get(t, id); got.State != task.StateSucceeded || got.ModelCalls != 1 {
			t.Errorf("%s: %s with %d calls", id, got.State, got.ModelCalls)
		}
	}
	if c := b.outcomes(t, h1, obs.WorkerClaimed) + b.outcomes(t, h2, obs.WorkerClaimed); c != 3 {
		t.Errorf("claimed %d times, want 3", c)
	}
	if d := b.pub.On(bus.TopicTasksDLQ); len(d) != 0 {
		t.Errorf("DLQ notices %+v", d)
	}
}

// One instance never runs a task twice at once. A nudge that reaches the instance already running
// the task — here after its lease lapsed mid-call, as when its renewals lose to contention — is
// acked without a claim, where a claim would take the task over in the same process and pay for a
// second call (and its transaction would contend with the holder's commit).
func TestDuplicateNudgeInTheSameInstanceAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const id = "dup-same"
	b.task(t, id)
	gate := b.srv.Block("mz")
	t.Cleanup(gate.Release)
	pol := policy("w")
	pol.LeaseTTL, pol.RenewEvery = 200*time.Millisecond, time.Hour
	h := b.handler(pol, chain("mz"))
	first := make(chan bus.Result, 1)
	go func() { first <- h.Handle(context.Background(), msg(id)) }()
	select {
	case <-gate.Entered():
	case <-time.After(10 * time.Second):
		t.Fatal("the first call never reached the model")
	}
	waitFor(t, "the lease to lapse", 5*time.Second, func() bool { return !b.get(t, id).Lease.Live(time.Now()) })
	dup := make(chan bus.Result, 1)
	go func() { dup <- h.Handle(context.Background(), msg(id)) }()
	select {
	case r := <-dup:
		if r != bus.Ack {
			t.Fatalf("duplicate: %v, want ack", r)
		}
	case <-gate.Entered():
		t.Fatal("the instance called the model a second time for a task it was running")
	case <-time.After(10 * time.Second):
		t.Fatal("the duplicate nudge was not acked")
	}
	gate.Release()
	if r := <-first; r != bus.Ack {
		t.Fatalf("first: %v", r)
	}
	if n := len(b.srv.Ledger().BillsFor(id)); n != 1 {
		t.Errorf("billed %d times, want 1", n)
	}
	if got := b.get(t, id); got.State != task.StateSucceeded || got.OutputEpoch != 1 || got.Lease.Epoch != 1 {
		t.Errorf("state %s output epoch %d lease epoch %d; want the first run's output, no takeover", got.State, got.OutputEpoch, got.Lease.Epoch)
	}
}

// zombie starts worker "zombie" on id with its calls held at the gate of model "mz", and a lease
// that expires at once and is never renewed (the process is paused). It returns when the call is
// at the gate and the lease has expired.
func (b *bundle) zombie(t *testing.T, id string) (*Handler, func(), chan bus.Result) {
	t.Helper()
	gate := b.srv.Block("mz")
	pol := policy("zombie")
	pol.LeaseTTL, pol.RenewEvery = 200*time.Millisecond, time.Hour
	z := b.handler(pol, chain("mz"))
	done := make(chan bus.Result, 1)
	go func() { done <- z.Handle(context.Background(), msg(id)) }()
	select {
	case <-gate.Entered():
	case <-time.After(10 * time.Second):
		t.Fatal("the zombie's call never reached the model")
	}
	waitFor(t, "the zombie's lease to expire", 5*time.Second, func() bool {
		return !b.get(t, id).Lease.Live(time.Now())
	})
	return z, gate.Release, done
}

// The zombie answers first: its paid output is kept, the new owner's call is cancelled and its
// later release is refused.
func TestZombieAnswersFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "za")
	_, releaseZombie, zdone := b.zombie(t, "za")

	newGate := b.srv.Block("mn")
	n := b.handler(policy("new"), chain("mn"))
	ndone := make(chan bus.Result, 1)
	go func() { ndone <- n.Handle(context.Background(), msg("za")) }()
	<-newGate.Entered() // the new owner (epoch 2) is calling the model too
	if got := b.get(t, "za"); got.Lease.Owner != "new" || got.Lease.Epoch != 2 || got.Claims != 1 {
		t.Fatalf("lease %+v claims %d; want taken over by new at epoch 2", got.Lease, got.Claims)
	}
	releaseZombie()
	if r := <-zdone; r != bus.Ack {
		t.Fatalf("zombie: %v", r)
	}
	if r := <-ndone; r != bus.Ack { // the renewal found the output and cancelled the call
		t.Fatalf("new owner: %v", r)
	}
	newGate.Release()
	got := b.get(t, "za")
	if got.State != task.StateSucceeded || got.OutputEpoch != 1 {
		t.Fatalf("state %s output epoch %d; want the zombie's (epoch 1) output kept", got.State, got.OutputEpoch)
	}
	if lost, stored := b.outcomes(t, n, obs.WorkerLost), b.outcomes(t, n, obs.WorkerStored); lost != 1 || stored != 0 {
		t.Errorf("new owner: %d lost, %d stored; want its call cancelled as lost", lost, stored)
	}
	// Its later release is refused: the task stays as the zombie left it.
	n.runOf(n.log, &protocol.Task{ID: "za", Lease: claim.Lease{Epoch: 2}}, nil).release(context.Background())
	if after, refused := b.get(t, "za"), b.outcomes(t, n, obs.WorkerRefused); after.State != task.StateSucceeded || after.Output != got.Output || refused != 1 {
		t.Errorf("release by the new owner applied: %s, refused %d", after.State, refused)
	}
}

// The new owner stores first: the zombie's output is refused and logged, its spend recorded.
func TestZombieLosesToNewOwner(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "zb")
	z, releaseZombie, zdone := b.zombie(t, "zb")
	n := b.handler(policy("new"), chain("mn"))
	if r := n.Handle(context.Background(), msg("zb")); r != bus.Ack {
		t.Fatalf("new owner: %v", r)
	}
	stored := b.get(t, "zb")
	if stored.State != task.StateSucceeded || stored.OutputEpoch != 2 {
		t.Fatalf("state %s epoch %d; want the new owner's output", stored.State, stored.OutputEpoch)
	}
	releaseZombie()
	if r := <-zdone; r != bus.Ack {
		t.Fatalf("zombie: %v", r)
	}
	got := b.get(t, "zb")
	if got.Output != stored.Output || got.OutputEpoch != 2 || !got.OutputAt.Equal(*stored.OutputAt) {
		t.Errorf("output overwritten: epoch %d", got.OutputEpoch)
	}
	if lost := b.outcomes(t, z, obs.WorkerLost); lost != 1 || !strings.Contains(b.logs.String(), "output refused") {
		t.Errorf("the zombie's refused write was not logged (%d lost)", lost)
	}
	if got.ModelCalls != 2 || got.Usage != b.srv.Ledger().Total.Billed {
		t.Errorf("calls %d usage %+v; want both paid calls recorded (%+v)", got.ModelCalls, got.Usage, b.srv.Ledger().Total.Billed)
	}
}

// A task re-queued and then cancelled while a zombie's call runs stays cancelled when the output
// arrives; its usage and cost are still recorded.
func TestCancelledWhileZombieRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "zc")
	z, releaseZombie, zdone := b.zombie(t, "zc")
	ctx := context.Background()
	if _, err := b.store.MutateTask(ctx, "zc", func(d *protocol.Task, now time.Time) error {
		d.State = task.StateQueued // re-queued (as a takeover-and-release would leave it) ...
		d.Lease.Clear()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.MutateTask(ctx, "zc", func(d *protocol.Task, now time.Time) error {
		d.Finish(task.StateCancelled, now) // ... then cancelled by its app
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	releaseZombie()
	<-zdone
	got := b.get(t, "zc")
	if got.State != task.StateCancelled || got.HasOutput() {
		t.Fatalf("state %s output %v; want cancelled without output", got.State, got.HasOutput())
	}
	if got.ModelCalls != 1 || got.Usage.TotalTokens == 0 || got.Usage != b.srv.Ledger().BilledFor("zc") {
		t.Errorf("calls %d usage %+v; want the zombie's spend %+v", got.ModelCalls, got.Usage, b.srv.Ledger().BilledFor("zc"))
	}
	if lost := b.outcomes(t, z, obs.WorkerLost); lost != 1 {
		t.Errorf("the zombie counted %d lost outputs, want 1", lost)
	}
}

func TestFailureOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()

	// Transient after the call's retries: released with a backoff, one attempt counted.
	b.task(t, "transient", func(d *protocol.Task) { d.Claims = 1 })
	b.srv.FailNext("m", 503, 503)
	h := b.handler(policy("w1"), chain("m"))
	h.Handle(ctx, msg("transient"))
	got := b.get(t, "transient")
	if got.State != task.StateQueued || got.Attempts != 1 || got.NotBefore == nil || !got.NotBefore.After(got.UpdatedAt) ||
		got.Lease.Owner != "" || got.Lease.Epoch != 1 || got.Claims != 0 || got.Error == nil || got.Error.Kind != task.KindTransient {
		t.Errorf("after a transient failure: %+v", got)
	}
	// Attempts exhausted: dead, task.dead queued, one DLQ notice recorded and published.
	pol := policy("w1")
	pol.MaxAttempts = 1
	b.task(t, "exhausted")
	b.srv.FailNext("m", 503, 503)
	b.handler(pol, chain("m")).Handle(ctx, msg("exhausted"))
	got = b.get(t, "exhausted")
	if got.State != task.StateDead || len(got.Notices) != 1 || got.Notices[0].Stage != task.StageGeneration || got.Delivery.EventType != task.EventDead {
		t.Errorf("after exhausted attempts: %s notices %+v event %s", got.State, got.Notices, got.Delivery.EventType)
	}
	notes := b.pub.On(bus.TopicTasksDLQ)
	if len(notes) != 1 || notes[0].Attrs[task.AttrTaskID] != "exhausted" || notes[0].Attrs[task.AttrKind] != "notice" ||
		notes[0].Attrs[task.AttrStage] != "generation" || notes[0].Attrs[task.AttrReplay] != "0" || notes[0].Attrs[task.AttrRound] != "0" {
		t.Errorf("DLQ notices %+v", notes)
	}
	// Permanent: failed, with its event.
	b.task(t, "permanent")
	b.srv.FailNext("m", 400)
	h.Handle(ctx, msg("permanent"))
	got = b.get(t, "permanent")
	if got.State != task.StateFailed || got.Error == nil || got.Error.Kind != task.KindPermanent || got.Error.Code != 400 || got.Delivery.EventType != task.EventFailed {
		t.Errorf("after a permanent failure: %s %+v", got.State, got.Error)
	}
	// The dead and the failed task nudge the resulthandler as a success does: their webhooks do
	// not wait for a sweep. The retried one has nothing to deliver yet.
	var nudged []string
	for _, m := range b.pub.On(bus.TopicResults) {
		nudged = append(nudged, m.Attrs[task.AttrTaskID])
	}
	if !slices.Equal(nudged, []string{"exhausted", "permanent"}) {
		t.Errorf("result nudges for %v, want exhausted and permanent", nudged)
	}
	for _, id := range nudged {
		heldOff(t, b.get(t, id), policy("w1").DeliveryLease)
	}
}

// heldOff checks that the sweeper holds off an ended task for the reservation of its delivery
// (lease after its end), since the worker nudges its webhook itself: a sweep meanwhile would only
// send a second nudge. And for no longer: a nudge lost with its carrier must not hold the webhook.
func heldOff(t *testing.T, got *protocol.Task, lease time.Duration) {
	t.Helper()
	if got.DueAt == nil || got.CompletedAt == nil || !got.DueAt.Equal(got.CompletedAt.Add(lease)) {
		t.Errorf("%s: due at %v, ended at %v; want the sweeper held off for the delivery's reservation, %s", got.ID, got.DueAt, got.CompletedAt, lease)
	}
}

// Every model unavailable: parked (waiting) with its own backoff, no attempt counted.
func TestParkWhenUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "park")
	gen := generatorFunc(func(context.Context, gemini.Request) (gemini.Result, error) {
		return gemini.Result{}, gemini.ErrUnavailable
	})
	h := New(b.store, gen, chain("m"), b.pub, b.log, policy("w1"))
	for want := 1; want <= 2; want++ {
		if want == 2 { // due again
			if _, err := b.store.MutateTask(context.Background(), "park", func(d *protocol.Task, now time.Time) error {
				d.NotBefore = &now
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		h.Handle(context.Background(), msg("park"))
		got := b.get(t, "park")
		if got.State != task.StateWaiting || got.Parks != want || got.Attempts != 0 || got.NotBefore == nil || got.Lease.Owner != "" {
			t.Fatalf("park %d: %+v", want, got)
		}
	}
}

type generatorFunc func(context.Context, gemini.Request) (gemini.Result, error)

func (f generatorFunc) Generate(ctx context.Context, r gemini.Request) (gemini.Result, error) {
	return f(ctx, r)
}

// A generation longer than the lease keeps its lease by renewal: one claim, one call.
func TestRenewalKeepsTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, 1500*time.Millisecond)
	b.task(t, "long")
	pol := policy("w1")
	pol.LeaseTTL, pol.RenewEvery = 400*time.Millisecond, 100*time.Millisecond
	h := b.handler(pol, chain("m"))
	other := b.handler(policy("w2"), chain("m"))
	done := make(chan struct{})
	go func() { defer close(done); h.Handle(context.Background(), msg("long")) }()
	waitFor(t, "the claim", 5*time.Second, func() bool { return b.get(t, "long").State == task.StateRunning })
	time.Sleep(2 * pol.LeaseTTL) // past the first lease's expiry: only renewal keeps it
	other.Handle(context.Background(), msg("long"))
	<-done
	got := b.get(t, "long")
	if got.State != task.StateSucceeded || got.OutputEpoch != 1 || got.Claims != 0 || b.srv.Ledger().Total.Calls != 1 {
		t.Errorf("state %s epoch %d claims %d calls %d", got.State, got.OutputEpoch, got.Claims, b.srv.Ledger().Total.Calls)
	}
}

// Abort (the end of the shutdown grace) makes an in-flight call release its lease: queued, no
// attempt counted, nothing lost.
func TestAbortReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "abort")
	gate := b.srv.Block("m")
	defer gate.Release()
	h := b.handler(policy("w1"), chain("m"))
	done := make(chan bus.Result, 1)
	go func() { done <- h.Handle(context.Background(), msg("abort")) }()
	<-gate.Entered()
	h.Abort()
	if r := <-done; r != bus.Ack {
		t.Fatalf("result %v", r)
	}
	got := b.get(t, "abort")
	if got.State != task.StateQueued || got.Attempts != 0 || got.Claims != 0 || got.Lease.Owner != "" || got.DueAt == nil {
		t.Errorf("after abort: %+v", got)
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	base := map[string]string{"GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:1"}
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"defaults", nil, ""},
		{"renew not shorter than ttl", map[string]string{"GENBOX_LEASE_TTL": "1s", "GENBOX_LEASE_RENEW": "1s"}, "GENBOX_LEASE_RENEW"},
		{"bad duration", map[string]string{"GENBOX_SHUTDOWN_GRACE": "soon"}, "GENBOX_SHUTDOWN_GRACE"},
		{"bad int", map[string]string{"GENBOX_CLAIM_CAP": "x"}, "GENBOX_CLAIM_CAP"},
		{"no project", map[string]string{"GOOGLE_CLOUD_PROJECT": ""}, "GOOGLE_CLOUD_PROJECT"},
		{"sweeper", map[string]string{"GENBOX_SWEEP_INTERVAL": "-1s"}, "GENBOX_SWEEP_INTERVAL"},
		{"budget policy", map[string]string{"GENBOX_BUDGET_POLICY": "spend"}, "GENBOX_BUDGET_POLICY"},
		{"cache ttl", map[string]string{"GENBOX_CACHE_TTL": "0s"}, "GENBOX_CACHE_TTL"},
		{"tenant wait", map[string]string{"GENBOX_TENANT_WAIT_MAX": "-1s"}, "GENBOX_TENANT_WAIT_MAX"},
		{"claim ahead", map[string]string{"GENBOX_CLAIM_AHEAD": "-1"}, "GENBOX_CLAIM_AHEAD"},
		{"in flight", map[string]string{"GENBOX_MAX_IN_FLIGHT": "-1"}, "GENBOX_MAX_IN_FLIGHT"},
		{"default budget", map[string]string{"GENBOX_DEFAULT_DAILY_BUDGET_USD": "-1"}, "GENBOX_DEFAULT_DAILY_BUDGET_USD"},
		{"project budget", map[string]string{"GENBOX_PROJECT_DAILY_BUDGET_USD": "lots"}, "GENBOX_PROJECT_DAILY_BUDGET_USD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			asked := map[string]bool{}
			c, err := FromEnv(func(k string) string {
				asked[k] = true
				if v, ok := tc.env[k]; ok {
					return v
				}
				return base[k]
			})
			if tc.wantErr == "" {
				if err != nil || c.Subscription != bus.SubWorker || c.ShutdownGrace != 8*time.Second || c.BudgetPolicy != quota.BudgetWait {
					t.Fatalf("%+v %v", c, err)
				}
				if c.Autoscale.Slots != c.Concurrency || c.Autoscale.DrainTimeout != c.LongestHold() || c.Autoscale.DrainTimeout < 10*time.Minute {
					t.Errorf("autoscaler: %d slots, drain timeout %s; want the %d slots and the longest hold %s", c.Autoscale.Slots, c.Autoscale.DrainTimeout, c.Concurrency, c.LongestHold())
				}
				if c.DefaultDailyBudgetUSD != 10 || c.ProjectDailyBudgetUSD != 100 || c.ModelPolicy(nil, nil).DefaultDailyBudgetUSD != 10 {
					t.Errorf("budgets by default: tenant $%v, project $%v; want $10 and $100, money limited out of the box", c.DefaultDailyBudgetUSD, c.ProjectDailyBudgetUSD)
				}
				for _, k := range []string{"GENBOX_LEASE_TTL", "GENBOX_LEASE_RENEW", "GENBOX_MAX_EXTENSION", "GENBOX_CONCURRENCY", "GENBOX_CLAIM_AHEAD", "GENBOX_MAX_IN_FLIGHT", "GENBOX_TASK_ATTEMPTS", "GENBOX_CLAIM_CAP", "GENBOX_SWEEP_INTERVAL", "GENBOX_TASKS_SUBSCRIPTION", "GOOGLE_CLOUD_PROJECT", "PORT", "GENBOX_SHUTDOWN_GRACE", "GEMINI_API_KEY",
					"GENBOX_BUDGET_POLICY", "GENBOX_BUDGET_RETRY", "GENBOX_TENANT_REFRESH", "GENBOX_TENANT_WAIT_MAX", "GENBOX_CACHE_TTL"} {
					if !asked[k] {
						t.Errorf("FromEnv never read %s", k)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrConfig) && !strings.Contains(err.Error(), "sweeper") {
				t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
			}
		})
	}
}

// A commit retried after an unknown outcome never records a call's spend twice.
func TestSpendRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.task(t, "once", func(d *protocol.Task) { d.State = task.StateCancelled })
	h := b.handler(policy("w1"), chain("m"))
	res := gemini.Result{Text: "late", Model: "m", Calls: 1, CostUSD: 0.01, Usage: task.Usage{PromptTokens: 10, OutputTokens: 5, TotalTokens: 15}}
	claimed := b.get(t, "once")
	claimed.Lease.Epoch = 7
	r := h.runOf(h.log, claimed, nil)
	r.res = res
	for range 2 { // the first commit's outcome was unknown: the output is offered again
		r.persist(context.Background(), answer{res: res, start: time.Now()})
	}
	r.fail(context.Background(), &protocol.TaskError{Kind: task.KindPermanent, Message: "x"})
	got := b.get(t, "once")
	if got.State != task.StateCancelled || got.HasOutput() || got.ModelCalls != 1 || got.Usage != res.Usage || got.CostUSD != res.CostUSD {
		t.Errorf("state %s output %v calls %d usage %+v cost %v; want the spend recorded once on a cancelled task", got.State, got.HasOutput(), got.ModelCalls, got.Usage, got.CostUSD)
	}
}

// A call that got no answer — a timeout — says nothing about the chain: the task is retried
// with an attempt counted, but its park count, which sizes its next park through an outage, is
// kept. An answered call (a 503) shows the chain takes calls again and resets it.
func TestNetworkFailureKeepsTheParkCount(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_CALL_TIMEOUT": "200ms"})
	ctx := context.Background()
	h := b.handler(policy("w1"), chain("m"))
	b.task(t, "timeout", func(d *protocol.Task) { d.Parks = 3 })
	gate := b.srv.Block("m")
	h.Handle(ctx, msg("timeout"))
	gate.Release()
	if got := b.get(t, "timeout"); got.State != task.StateQueued || got.Attempts != 1 || got.Parks != 3 || got.Error == nil || got.Error.Kind != task.KindNetwork {
		t.Errorf("after a timeout: state %s attempts %d parks %d error %+v; want queued, one attempt, parks kept", got.State, got.Attempts, got.Parks, got.Error)
	}
	b.task(t, "answered", func(d *protocol.Task) { d.Parks = 3 })
	b.srv.FailNext("m", 503, 503)
	h.Handle(ctx, msg("answered"))
	if got := b.get(t, "answered"); got.State != task.StateQueued || got.Parks != 0 {
		t.Errorf("after a 503: state %s parks %d; want queued, parks reset", got.State, got.Parks)
	}
}

// A task parked because every model is unavailable waits no longer than until a model may take
// a probe, however long its own park backoff has grown: then the sweeper sees it, and one such
// task's call is the probe that finds the chain recovered.
func TestParkEndsWhenTheChainMayTakeAProbe(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_BREAKER_FAILURES": "1", "GENBOX_BREAKER_COOLDOWN": "3s"})
	pol := policy("w1")
	pol.ParkBase, pol.ParkMax = time.Hour, time.Hour
	h := New(b.store, b.gen, chain("m"), b.pub, b.log, pol, WithModelPolicy(ModelPolicy{Estimator: b.gen}))
	b.srv.Outage("m", time.Hour)
	b.task(t, "parked", func(d *protocol.Task) { d.Parks = 5 })
	start := time.Now()
	h.Handle(context.Background(), msg("parked"))
	got := b.get(t, "parked")
	if got.State != task.StateWaiting || got.NotBefore == nil {
		t.Fatalf("after the call that opened the only breaker: state %s not_before %v, want parked", got.State, got.NotBefore)
	}
	if wait := got.NotBefore.Sub(start); wait > 10*time.Second {
		t.Errorf("parked for %s, want no longer than the breaker's 3 s cooldown", wait.Round(time.Second))
	}
}
