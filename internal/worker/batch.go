package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/batcher"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

var _ batcher.Tasks = (*Handler)(nil)

// WithBatch makes batch-mode tasks wait for the batcher (cfg's Deadline and Margin) instead of
// running online; without it they run online as standard tasks.
func WithBatch(cfg batcher.Config) Option { return func(h *Handler) { h.batch = cfg } }

// batchTimes are a batch task's deadline (its run_before, or Deadline after its creation,
// whichever is sooner) and the time it must leave batching to run online before it.
func (h *Handler) batchTimes(t *protocol.Task) (deadline, online time.Time) {
	deadline = t.CreatedAt.Add(h.batch.Deadline)
	if t.RunBefore != nil && t.RunBefore.Before(deadline) {
		deadline = *t.RunBefore
	}
	return deadline, deadline.Add(-h.batch.Margin)
}

// holdForBatch hands a claimed batch-mode task to the batcher: it waits (queued, batch_model
// set) until a job takes it, or until it must leave batching, when the sweeper brings it back
// here to run online (or, for a family whose batch_fallback is none, to wait for batches until
// its deadline, then fail as expired). A task whose tenant's budget or the project's has no room
// for its worst case meets the budget policy here, as online, instead of waiting for a job that
// would not take it (Admit). It reports whether it took the task; false runs it online.
func (r *run) holdForBatch(ctx context.Context, rend *prompts.Rendered, req gemini.Request) bool {
	h, t, log := r.h, r.task, r.log
	if t.Mode != task.ModeBatch || t.BatchOnline || h.batch.Deadline <= 0 {
		return false
	}
	if h.mp.Estimator != nil && req.MaxCostUSD > 0 {
		if _, est := h.mp.Estimator.Estimate(req); est > req.MaxCostUSD {
			return false // the online path refuses it with its reason
		}
	}
	models := req.Models
	if h.mp.Estimator != nil {
		models = h.mp.Estimator.Chain(req)
	}
	if len(models) == 0 {
		return false
	}
	if l, err := h.limits(ctx, t.Tenant); err == nil && l.TPM > 0 && h.Tokens(req) > l.TPM {
		return false // no job could take it under its tenant's tpm: the online path refuses it with its reason
	}
	now := time.Now()
	deadline, until := h.batchTimes(t)
	if rend.BatchFallback == prompts.BatchFallbackNone {
		until = deadline
	}
	if !now.Before(until) {
		if rend.BatchFallback == prompts.BatchFallbackOnline {
			// Out of the batcher's reach for good: a retry's backoff must not look like a wait for a batch.
			_, ok := r.fencedWrite(ctx, "batch fallback", func(t *protocol.Task, _ time.Time) {
				protocol.RunOnline(t)
			})
			log.InfoContext(ctx, "a batch can no longer meet the task's deadline; running online", "deadline", deadline)
			return !ok
		}
		r.fail(ctx, &protocol.TaskError{Kind: task.KindExpired, Message: "its batch deadline passed before a batch ran it (batch_fallback: none)"})
		return true
	}
	if !r.affordable(ctx, req, models[0]) {
		return true
	}
	if _, ok := r.outcome(ctx, "batch hold", func(t *protocol.Task, _ time.Time) {
		r.rules.HoldForBatch(t, r.epoch, models[0], until)
	}); ok {
		log.InfoContext(ctx, "waiting for a batch", "model", models[0], "until", until)
	}
	return true
}

// affordable reports whether the budgets have room for req's worst case in a batch job of model,
// as Admit will reserve it; the reservation is only a check here, released at once. When they
// have none, or a total or the tenant's limits cannot be read, it has written the claimed task's
// outcome as the online path does (overBudget, handBack).
func (r *run) affordable(ctx context.Context, req gemini.Request, model string) bool {
	h, t := r.h, r.task
	limits, err := h.limits(ctx, t.Tenant)
	if err != nil {
		r.handBack(ctx, h.readRetry(), "tenant limits unreadable", err)
		return false
	}
	hold, err := h.reserve(ctx, t.Tenant, limits, h.batchWorst(req, model))
	if err != nil {
		r.overBudget(ctx, err)
		return false
	}
	if hold != nil {
		hold.Settle(0)
	}
	return true
}

// batchWorst is the most req can spend as a request of a batch job of model.
func (h *Handler) batchWorst(req gemini.Request, model string) float64 {
	if h.mp.Estimator == nil {
		return 0
	}
	return h.mp.Estimator.BatchMaxSpend(req, model)
}

// BatchLimits are what tenant's tasks in batch jobs not yet done may hold at once: as many
// tasks as its concurrency limit, as it bounds its calls in flight online (a job holds a task
// for its whole run), and as many tokens, their requests' worst cases, as its tpm — its share
// of the model's quota, which for batch jobs Gemini counts in tokens enqueued, not per minute
// (docs/capacity.md, *A tenant's rpm and tpm*).
func (h *Handler) BatchLimits(ctx context.Context, tenant string) (store.BatchLoad, error) {
	l, err := h.limits(ctx, tenant)
	return store.BatchLoad{Tasks: l.Concurrency, Tokens: l.TPM}, err
}

// Tokens is the worst case of req in tokens (its prompt and largest output), as a tenant's
// tpm counts a call.
func (h *Handler) Tokens(req gemini.Request) int64 {
	if h.mp.Estimator == nil {
		return 0
	}
	tokens, _ := h.mp.Estimator.Estimate(req)
	return tokens
}

// Admit reserves the worst case of a task waiting for a batch, req's at model's batch price,
// before it joins a job, as before does an online call's: against its tenant's daily budget and
// the project's, failing closed. A task whose limits or budget cannot be read waits for a later
// job; one a budget refuses leaves batching for the worker, which applies the budget policy
// (affordable).
func (h *Handler) Admit(ctx context.Context, t *protocol.Task, req gemini.Request, model string) (*quota.Hold, bool) {
	log := h.log.With("task_id", t.ID, "model", model)
	limits, err := h.limits(ctx, t.Tenant)
	if err != nil {
		log.WarnContext(ctx, "tenant limits unreadable; the task waits for a later batch job", "error", err)
		return nil, false
	}
	hold, err := h.reserve(ctx, t.Tenant, limits, h.batchWorst(req, model))
	switch {
	case err == nil:
		return hold, true
	case errors.Is(err, quota.ErrBudgetExhausted) || errors.Is(err, quota.ErrProjectBudgetExhausted):
		h.leaveBatch(ctx, log, t.ID, model, err)
	default:
		log.WarnContext(ctx, "budget unreadable; the task waits for a later batch job", "error", err)
	}
	return nil, false
}

// leaveBatch makes a task waiting for a batch of model due now and nudges it, so that a worker
// applies the budget policy to it (affordable); it is left alone if a job took it meanwhile.
func (h *Handler) leaveBatch(ctx context.Context, log *slog.Logger, id, model string, cause error) {
	_, err := h.store.MutateTask(ctx, id, func(t *protocol.Task, now time.Time) error {
		if !protocol.LeaveBatch(t, model, now) {
			return store.ErrNoChange
		}
		return nil
	})
	if err != nil {
		log.WarnContext(ctx, "over budget; not taken out of batching", "error", err)
		return
	}
	log.InfoContext(ctx, "over budget; handed to the worker's budget policy", "error", cause)
	if _, err := h.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id}); err != nil {
		log.WarnContext(ctx, "nudge not published; the sweeper will", "error", err)
	}
}

// SettleCharge puts what member m spent in the place of the worst case charged when it joined
// its job.
func (h *Handler) SettleCharge(m store.BatchMember, costUSD float64) {
	if h.mp.Budgets != nil {
		h.mp.Budgets.SettleCharge(quota.Charge{Tenant: m.Tenant, Day: m.ChargeDay, USD: m.ChargeUSD}, costUSD)
	}
}

// BatchRequest renders the model request of a task joining a batch job, and its output cache
// key when it may be cached.
func (h *Handler) BatchRequest(t *protocol.Task) (gemini.Request, string, error) {
	r, req, err := h.request(t)
	if err != nil {
		return gemini.Request{}, "", err
	}
	return h.withCopies(t, req), h.cacheKey(t, r, req), nil
}

// SettleBatch applies one request's outcome to its task, as the job's lease owner and under the
// outbox's rules (docs/architecture.md §4 step 4): an answer is persisted (first output wins; a cancelled,
// discarded or expired task records the spend and keeps its state); a permanent error fails
// the task; any other error sends it back with an attempt counted (online after a quality
// failure: another batch would repeat the same conditions); a lost job sends it back with none.
// It reports whether the task is settled: out of the job, its spend recorded.
func (h *Handler) SettleBatch(ctx context.Context, j *store.BatchJob, m store.BatchMember, o batcher.Outcome) (bool, error) {
	ctx = context.WithoutCancel(ctx)
	r := h.batchRun(j, m, o.Result)
	if protocol.Spent(o.Result) { // the budgets count it once the job is done (SettleCharge)
		h.metrics.Generation(ctx, o.Result.Model, m.Tenant, o.Result.Usage, o.Result.CostUSD, 0)
	}
	switch class := gemini.ClassOf(o.Err); {
	case o.Lost:
		r.sendBack(ctx, j.Model, nil, o.Online)
	case o.Err == nil:
		r.persist(ctx, answer{res: o.Result, fingerprint: o.Fingerprint})
	case class == gemini.Permanent || class == gemini.Budget:
		r.fail(ctx, taskError(o.Err))
	default:
		r.sendBack(ctx, j.Model, taskError(o.Err), class == gemini.Quality)
	}
	t, err := h.store.GetTask(ctx, m.TaskID)
	if errors.Is(err, store.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	held := t.State == task.StateRunning && t.Lease.Owner == r.rules.Owner && t.Lease.Epoch == m.Epoch
	return !held && (!protocol.Spent(o.Result) || slices.Contains(t.SpentBy, r.rules.SpendKey(m.Epoch))), nil
}

// sendBack releases a task of a batch job, fenced by the job's lease: with the request's error
// counted as an attempt (dead past the cap), or, for a lost job, none. It waits for the next job
// while its time in batches lasts; otherwise, or when online is set, it is due now and nudged,
// and the worker runs it online (or, for a batch_fallback none family, holds it again).
func (r *run) sendBack(ctx context.Context, model string, e *protocol.TaskError, online bool) {
	h, log, id := r.h, r.log, r.id
	dead, due := false, false
	t, ok := r.outcome(ctx, "send back", func(t *protocol.Task, now time.Time) {
		dead, due = r.rules.SendBack(t, r.epoch, now, model, e, online)
	})
	switch {
	case !ok:
	case dead:
		h.metrics.WorkerOutcome(ctx, obs.WorkerDead)
		h.finished(ctx, t)
		log.ErrorContext(ctx, "batch attempts exhausted; dead", "attempts", t.Attempts, "error", e.Message)
		h.nudgeResult(ctx, log, t)
		h.publishNotices(ctx, log, t)
	case due:
		log.InfoContext(ctx, "batch task sent back to run online", "online", online, "error", errMessage(e))
		if _, err := h.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id}); err != nil {
			log.WarnContext(ctx, "nudge not published; the sweeper will", "error", err)
		}
	default:
		log.InfoContext(ctx, "batch task sent back to the next batch", "error", errMessage(e))
	}
}

func errMessage(e *protocol.TaskError) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("%s: %s", e.Kind, e.Message)
}

// RenewBatch extends the lease of a task of batch job id, fenced by the job's lease and the
// task's claim epoch; an expired lease is extended all the same (nobody else may take a task of
// a job). false means the task no longer runs in the job (it was cancelled, or settled).
func (h *Handler) RenewBatch(ctx context.Context, id string, m store.BatchMember, ttl time.Duration) (bool, error) {
	rules := h.pol.rules().As(protocol.BatchOwner(id))
	held := false
	_, err := h.store.MutateTask(ctx, m.TaskID, func(t *protocol.Task, now time.Time) error {
		if held = rules.Extend(t, m.Epoch, now, ttl); !held {
			return store.ErrNoChange
		}
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return held, err
}
