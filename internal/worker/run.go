package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
)

// run is one claimed task as its lease holder runs it, the way River's job executor is one value
// per job: what the run knows — the task, the epoch it holds it at, its logger, what its call
// spent, its place in the handler's capacity — and its outcomes (release, retry, park, fail,
// persist…), which take only ctx and their own reason. The holder is this instance for a task
// it claimed (Handler.runOf), or a batch job settling one of its tasks (Handler.batchRun): the
// same value, another owner in its rules.
type run struct {
	h     *Handler
	rules protocol.Rules // the holder's: this instance, or the batch job
	id    string
	epoch int64
	// task is the document as claimed; for a batch job's task, its id and replay only.
	task *protocol.Task
	log  *slog.Logger
	// res is what the run's model call spent: every outcome records it, once (AddSpend).
	res   gemini.Result
	place *place // nil for a batch job's task, which holds none of this instance's capacity
	// ticket is what the call holds of the tenant's budget and rates, once the policy let it
	// through (before); nil until then.
	ticket *ticket
}

// callOver gives back what the run's call holds: its ticket, settled with what the call spent,
// then its model-call slot and its place among the claimed (place.endCall), so that what follows
// — the outcome's write, the result's nudge, the ack — holds only the task's place in hand. Every
// outcome begins with it and execute defers it, so no path leaves any of them taken; it may be
// called more than once.
func (r *run) callOver() {
	if r.ticket != nil {
		r.ticket.done(r.res)
	}
	if r.place != nil {
		r.place.endCall()
	}
}

// outcome writes an outcome of the run (fencedWrite), its call over first (callOver).
func (r *run) outcome(ctx context.Context, what string, change func(t *protocol.Task, now time.Time)) (*protocol.Task, bool) {
	r.callOver()
	return r.fencedWrite(ctx, what, change)
}

// runOf is the run of t, claimed by this instance at t's lease epoch, in its place p.
func (h *Handler) runOf(log *slog.Logger, t *protocol.Task, p *place) *run {
	return &run{h: h, rules: h.pol.rules(), id: t.ID, epoch: t.Lease.Epoch, task: t,
		log: log.With("epoch", t.Lease.Epoch), place: p}
}

// batchRun is the run of member m of batch job j as the job's lease owner, its request's outcome
// spent res: its writes are fenced by the job's lease and the member's claim epoch, and the
// spend it records is keyed by the job, the same in every instance that settles it.
func (h *Handler) batchRun(j *store.BatchJob, m store.BatchMember, res gemini.Result) *run {
	return &run{h: h, rules: h.pol.rules().As(protocol.BatchOwner(j.ID)), id: m.TaskID, epoch: m.Epoch,
		task: &protocol.Task{ID: m.TaskID, Replay: m.Replay},
		log:  h.log.With("task_id", m.TaskID, "batch_job", j.ID, "epoch", m.Epoch), res: res}
}

// fencedWrite applies change to the task if the run still holds it; the spend of the run's call
// is recorded either way. A refused write is logged; the message is acked all the same.
func (r *run) fencedWrite(ctx context.Context, what string, change func(t *protocol.Task, now time.Time)) (*protocol.Task, bool) {
	ctx = context.WithoutCancel(ctx)
	applied := false
	t, err := r.h.mutateRetrying(ctx, r.log, &protocol.Task{ID: r.id}, func(t *protocol.Task, now time.Time) error {
		applied = r.rules.Holds(t, r.epoch)
		if added := r.rules.AddSpend(t, r.epoch, r.res); !applied && !added {
			return store.ErrNoChange
		}
		if applied {
			change(t, now)
		}
		return nil
	})
	if err != nil {
		r.log.ErrorContext(ctx, what+": write failed; the lease will expire and the sweeper re-nudges", "error", err)
		return nil, false
	}
	if !applied {
		r.h.metrics.WorkerOutcome(ctx, obs.WorkerRefused)
		r.log.WarnContext(ctx, what+": refused, the lease is no longer mine", "state", string(t.State), "lease_epoch", t.Lease.Epoch)
	}
	return t, applied
}
