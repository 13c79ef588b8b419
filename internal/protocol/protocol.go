// Package protocol is the task document and its protocol (docs/architecture.md §4): Task, its
// webhook delivery, notices and follow-ups, and every rule of them as a pure function of the
// document and the time — no read, no write, no clock. Its named state changes (Rules: claim,
// renew, requeue, park, fail, kill, commit the output…) are what a worker or a batch job applies
// inside the store's read-modify-write of the task (River's driver names its JobSetState…
// changes the same way); beside them are the rules every writer shares: what is pending and due
// (pending.go: TaskDue, Delivery.Claimable, DueAt, Finalize), ending a task and queueing its
// webhook (Task.Finish), a delivery's reservation (Task.ReserveDelivery), a slot's wait
// (Task.AwaitSlot), the API view and the model request of a task (Task.View, Task.Request).
// Package store only persists the document; it imports this package, never the other way.
package protocol

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// ErrOutputStored is Renew's answer when the task already has its output: the call may stop.
var ErrOutputStored = errors.New("protocol: the task already has its output")

// Rules are the parameters of the changes a lease holder makes: who it is and the worker's
// policy (GENBOX_LEASE_TTL, GENBOX_MAX_ATTEMPTS, …). A batch job's changes are a worker's with
// the job as the owner (BatchOwner).
type Rules struct {
	Owner         string        // the lease owner: an instance, or a batch job
	LeaseTTL      time.Duration // a claim's lease
	MaxAttempts   int           // failed generations before dead
	ClaimCap      int           // takeovers of an expired lease before dead
	NudgeGrace    time.Duration // the sweeper holds off a dead task's DLQ notice this long
	DeliveryLease time.Duration // the reservation of an ended task's delivery for the holder's nudge
}

// As returns r with owner as the lease owner: a batch job's rules are the worker's under its name.
func (r Rules) As(owner string) Rules {
	r.Owner = owner
	return r
}

// Holds reports whether the holder of epoch may still change t: it runs under r's lease of that
// epoch and has no output. Every change but an output's commit and spend is fenced by it.
func (r Rules) Holds(t *Task, epoch int64) bool {
	return t.State == task.StateRunning && t.Lease.Owner == r.Owner && t.Lease.Epoch == epoch && !t.HasOutput()
}

// Claim takes t for r's owner at now: running, no longer waiting for a slot, under a fresh lease
// (a new epoch). It fails with claim.ErrHeld while another holder's lease is live.
func (r Rules) Claim(t *Task, now time.Time) error {
	if err := t.Lease.Take(r.Owner, now, r.LeaseTTL); err != nil {
		return err
	}
	t.State, t.AwaitsSlot = task.StateRunning, false
	return nil
}

// TakeOver counts a claim of a running task whose lease expired; past the claim cap the task has
// killed its workers, and it dies (Kill). It reports whether it did.
func (r Rules) TakeOver(t *Task, now time.Time) (dead bool) {
	t.Claims++
	if t.Claims <= r.ClaimCap {
		return false
	}
	t.Error = &TaskError{Kind: task.KindCrash, Message: fmt.Sprintf("the task's lease expired %d times without a release: it kills its worker", t.Claims-1)}
	r.Kill(t, now)
	return true
}

// Expire fails t, whose run_before passed before its model was called.
func (r Rules) Expire(t *Task, now time.Time) {
	t.AwaitsSlot = false
	r.Fail(t, &TaskError{Kind: task.KindExpired, Message: "run_before passed before the model was called"}, now)
}

// Renew extends the lease of epoch to now+LeaseTTL — a lapsed one too, while nobody took it
// over. It fails with ErrOutputStored when t has its output, and with claim.ErrLeaseLost when
// r no longer holds it.
func (r Rules) Renew(t *Task, epoch int64, now time.Time) error {
	if t.HasOutput() {
		return ErrOutputStored
	}
	if !r.Holds(t, epoch) {
		return claim.ErrLeaseLost
	}
	return t.Lease.Renew(r.Owner, epoch, now, r.LeaseTTL)
}

// Extend sets the lease of a task a batch job holds at epoch to expire at now+ttl, expired or
// not (nobody else may take a task of a job), and reports whether the job still holds it.
func (r Rules) Extend(t *Task, epoch int64, now time.Time, ttl time.Duration) bool {
	if !r.Holds(t, epoch) {
		return false
	}
	exp := now.Add(ttl)
	t.Lease.ExpiresAt = &exp
	return true
}

// Finish ends t in state at now (Task.Finish) and reserves its delivery for the holder's
// nudge (Task.ReserveDelivery), so that the resulthandler receiving it claims nothing
// (docs/architecture.md §6); a nudge lost with its process holds the delivery no longer than
// the reservation (docs/liveness.md).
func (r Rules) Finish(t *Task, state task.State, now time.Time) {
	t.Finish(state, now)
	t.ReserveDelivery(now, r.DeliveryLease)
}

// Fail ends t as failed with e.
func (r Rules) Fail(t *Task, e *TaskError, now time.Time) {
	t.Error = e
	r.Finish(t, task.StateFailed, now)
}

// Kill ends t as dead (stage generation) with a DLQ notice kept on the task as an outbox: the
// holder publishes it after the commit, and the sweeper re-sends it after NudgeGrace until the
// dlqnotifier clears it.
func (r Rules) Kill(t *Task, now time.Time) {
	next := now.Add(r.NudgeGrace)
	t.Notices = append(t.Notices, Notice{Stage: task.StageGeneration, Replay: t.Replay, Round: 0, NextAttemptAt: &next})
	r.Finish(t, task.StateDead, now)
}

// Release hands t back, queued, without an attempt counted and with its not_before as it was: a
// clean release (shutdown, a slot handed to an instance that stopped taking work).
func (r Rules) Release(t *Task, epoch int64) {
	t.State, t.Claims = task.StateQueued, 0
	_ = t.Lease.Release(r.Owner, epoch) // the caller checked Holds
}

// Requeue hands t back, queued, to be claimed again from notBefore, without an attempt counted.
func (r Rules) Requeue(t *Task, epoch int64, notBefore time.Time) {
	r.Release(t, epoch)
	t.NotBefore = &notBefore
}

// Retry records a failed attempt (e) and requeues t after delay(attempts), or kills it when its
// attempts are exhausted; it reports whether it did. A failure that counts no attempt (rate
// limits the servers turned away) never kills. A model that answered resets the park count: the
// chain takes calls again.
func (r Rules) Retry(t *Task, epoch int64, now time.Time, e *TaskError, count bool, delay func(attempts int) time.Duration) (dead bool) {
	if count {
		t.Attempts++
	}
	t.Error = e
	if count && t.Attempts >= r.MaxAttempts {
		r.Kill(t, now)
		return true
	}
	if e.Kind != task.KindNetwork {
		t.Parks = 0
	}
	r.Requeue(t, epoch, now.Add(delay(t.Attempts)))
	return false
}

// Shed requeues t after a flex call the Flex tier shed, after delay(sheds) of its consecutive
// sheds: no attempt counted.
func (r Rules) Shed(t *Task, epoch int64, now time.Time, delay func(sheds int) time.Duration) {
	t.Sheds++
	r.Requeue(t, epoch, now.Add(delay(t.Sheds)))
}

// Park moves t to waiting when every model of its chain is unavailable: after delay(parks) of
// its consecutive parks, but no later than nextCall, when the chain may take a call again (nil:
// unknown), so that the sweeper sees it then whatever its backoff has grown to. No attempt is
// counted.
func (r Rules) Park(t *Task, epoch int64, now time.Time, delay func(parks int) time.Duration, nextCall *time.Time) {
	t.Parks++
	nb := now.Add(delay(t.Parks))
	if nextCall != nil && nextCall.Before(nb) {
		nb = later(*nextCall, now)
	}
	r.Release(t, epoch)
	t.State, t.NotBefore = task.StateWaiting, &nb
}

// BudgetWait moves t to waiting on a spent budget (e), without a call or an attempt: until the
// day's reset, or after retry when that comes first (0: at the reset).
func (r Rules) BudgetWait(t *Task, epoch int64, now time.Time, e *TaskError, retry time.Duration) {
	nb := quota.ResetAt(now)
	if retry > 0 && now.Add(retry).Before(nb) {
		nb = now.Add(retry)
	}
	r.Release(t, epoch)
	t.State, t.NotBefore, t.Error = task.StateWaiting, &nb, e
}

// HoldForBatch hands t to the batcher: queued, waiting for a batch job of model until until,
// when the sweeper brings it back to a worker.
func (r Rules) HoldForBatch(t *Task, epoch int64, model string, until time.Time) {
	r.Requeue(t, epoch, until)
	t.BatchModel = model
}

// RunOnline takes t out of the batcher's reach for good: a batch can no longer serve it.
func RunOnline(t *Task) { t.BatchModel, t.BatchOnline = "", true }

// LeaveBatch makes t, waiting for a batch of model, due now for a worker (a budget refused it a
// place in a job); it reports false, changing nothing, when t no longer waits for that batch.
func LeaveBatch(t *Task, model string, now time.Time) bool {
	if t.State != task.StateQueued || t.BatchModel != model || t.HasOutput() {
		return false
	}
	t.BatchModel, t.NotBefore = "", &now
	return true
}

// SendBack releases t from a batch job: with e counted as an attempt (dead past the cap, and
// reported so), or none for a lost job (e nil). It waits for the next job of model while its
// time in batches lasts; otherwise, or when online is set, it is due now (due reported) for a
// worker to run online.
func (r Rules) SendBack(t *Task, epoch int64, now time.Time, model string, e *TaskError, online bool) (dead, due bool) {
	if e != nil {
		t.Attempts++
		t.Error = e
		if t.Attempts >= r.MaxAttempts {
			r.Kill(t, now)
			return true, false
		}
	}
	r.Release(t, epoch)
	if !online && t.NotBefore != nil && now.Before(*t.NotBefore) {
		t.BatchModel = model
		return false, false
	}
	t.BatchModel, t.BatchOnline, t.NotBefore = "", online, &now
	return false, true
}

// ClaimDelivery is a resulthandler's claim of t's pending webhook delivery for owner until
// now+ttl: when the delivery is claimable at now (Delivery.Claimable) — a reservation made
// for the nudge carrying epoch reserved counts as free for that nudge — it takes the delivery
// lease and counts the attempt, once (a reservation it takes over had counted it), and reports
// true; otherwise it changes nothing.
func ClaimDelivery(t *Task, owner string, now time.Time, ttl time.Duration, reserved int64) bool {
	d := &t.Delivery
	mine := reserved > 0 && t.ReservedDelivery(now) == reserved
	if !d.Claimable(now, reserved) {
		return false
	}
	if mine {
		d.Lease.Clear()
		d.Attempts-- // the reservation counted this attempt
	}
	return d.Take(owner, now, ttl) == nil
}

// JoinBatch takes t, waiting for a batch of model, into batch job job (owner
// BatchOwner(job)) under a lease until now+ttl, and reports whether it did: not when t no
// longer waits for that batch, or is already due (TaskDue), a worker's to claim.
func JoinBatch(t *Task, job, model string, now time.Time, ttl time.Duration) bool {
	if t.State != task.StateQueued || t.BatchModel != model || t.HasOutput() || TaskDue(t, now) {
		return false
	}
	if err := t.Lease.Take(BatchOwner(job), now, ttl); err != nil {
		return false
	}
	t.State, t.BatchJob, t.BatchModel, t.Claims = task.StateRunning, job, "", 0
	return true
}

// Output is an answer to commit as a task's output.
type Output struct {
	Text        string
	Model       string
	Tier        gemini.Tier
	Degraded    bool
	Cached      bool   // served from the output cache
	Stale       bool   // the tenant's last good output of the subject, every model unavailable
	Fingerprint string // the cache key, when the request may be cached
}

// OutputMine reports whether t's output is the one the holder of epoch committed in replay: a
// commit retried after an unknown outcome finds its own.
func OutputMine(t *Task, replay int, epoch int64) bool {
	return t.HasOutput() && t.Replay == replay && t.OutputEpoch == epoch
}

// TakesOutput reports whether t, of which replay was claimed, still takes an output: first
// output wins, never overwritten, and a task that ended otherwise (cancelled, failed, dead) is
// never revived — even by a zombie whose lease was taken over.
func TakesOutput(t *Task, replay int) bool {
	if t.Replay != replay || t.HasOutput() {
		return false
	}
	switch t.State {
	case task.StateRunning, task.StateQueued, task.StateWaiting:
		return true
	}
	return false
}

// CommitOutput stores o as t's output, made under epoch, and ends t as succeeded (check
// TakesOutput first).
func (r Rules) CommitOutput(t *Task, epoch int64, o Output, now time.Time) {
	t.Output, t.OutputEpoch, t.OutputAt = o.Text, epoch, &now
	t.Model, t.Tier, t.Degraded, t.Error = o.Model, string(o.Tier), o.Degraded, nil
	t.CacheHit, t.Stale = o.Cached, o.Stale
	if o.Fingerprint != "" {
		t.Fingerprint = o.Fingerprint
	}
	r.Finish(t, task.StateSucceeded, now)
}

// SpendKey names the spend of the call r's owner made under epoch in t's spent_by.
func (r Rules) SpendKey(epoch int64) string { return r.Owner + ":" + strconv.FormatInt(epoch, 10) }

// Spent reports whether res paid for anything worth recording.
func Spent(res gemini.Result) bool {
	return res.Calls > 0 || res.CostUSD > 0 || res.Usage != (task.Usage{}) || res.InDoubt != (task.Usage{})
}

// AddSpend records what the call r's owner made under epoch paid, once: paid tokens are recorded
// whatever happens to the task, and a commit retried after an unknown outcome never counts them
// twice. The usage and cost go to the replay the call belonged to: a zombie of a replay a
// Regenerate ended charges that replay's previous[] entry, not the new one. It reports whether
// it added anything.
func (r Rules) AddSpend(t *Task, epoch int64, res gemini.Result) bool {
	key := r.SpendKey(epoch)
	if !Spent(res) || slices.Contains(t.SpentBy, key) {
		return false
	}
	t.SpentBy = append(t.SpentBy, key)
	usage, cost, replay := &t.Usage, &t.CostUSD, t.Replay
	if g := t.EarlierReplay(epoch); g != nil {
		usage, cost, replay = &g.Usage, &g.CostUSD, g.Replay
	}
	t.LogAttempts(AttemptRecords(replay, epoch, res.Attempts)...)
	*usage = usage.Add(res.Usage)
	*cost += res.CostUSD
	t.InDoubt = t.InDoubt.Add(res.InDoubt)
	t.ModelCalls += res.Calls
	return true
}

// AttemptRecords are the attempt log's records of a call's model calls, made under epoch in replay.
func AttemptRecords(replay int, epoch int64, calls []gemini.Attempt) []AttemptRecord {
	out := make([]AttemptRecord, 0, len(calls))
	for _, a := range calls {
		out = append(out, AttemptRecord{Replay: replay, Epoch: epoch, Number: a.Number, Model: a.Model, Class: string(a.Class),
			Latency: a.Latency.Milliseconds(), Usage: a.Usage, CostUSD: a.CostUSD, At: a.Start.UTC()})
	}
	return out
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
