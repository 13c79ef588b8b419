package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Estimator resolves a request's model chain (part of the cache key), prices its worst case
// before any call is made — one call (max_cost_usd is checked against it), the whole attempt
// budget (the tenant's budget reserves it) and one request of a batch job (likewise) — and tells
// whether, or from when, any model of a chain can take a call (gemini.Client).
type Estimator interface {
	Chain(req gemini.Request) []string
	Estimate(req gemini.Request) (tokens int64, costUSD float64)
	MaxSpend(req gemini.Request) float64
	BatchMaxSpend(req gemini.Request, model string) float64
	Available(models []string) bool
	NextCall(models []string) time.Time
}

// TenantLimits returns a tenant's limits; a tenant without a document has none (TenantCache).
type TenantLimits interface {
	Limits(ctx context.Context, tenant string) (store.Limits, error)
}

var (
	_ Estimator    = (*gemini.Client)(nil)
	_ TenantLimits = (*TenantCache)(nil)
)

// ModelPolicy is what the worker applies between the claim and the model call (docs/architecture.md §4 step 2
// and §5): the output cache, max_cost_usd against the estimate, the tenant's daily budget, and
// its rpm and tpm (its concurrency cap is applied at the claim: WithTenantSlots). A nil part is
// not applied; the cache needs Estimator (the chain is part of the key). The stale answer of an
// exhausted chain and the last good output need only the store.
type ModelPolicy struct {
	Estimator Estimator
	Tenants   TenantLimits
	// Budgets holds each call's worst case (its attempt budget) against the tenant's
	// DailyBudgetUSD — DefaultDailyBudgetUSD when its limits set none — and the project's
	// budget, if Budgets has one; settled with the cost.
	Budgets               *quota.Budgets
	DefaultDailyBudgetUSD float64
	// Rates takes each call from its tenant's rpm and tpm (its limits' RPM and TPM), shared by
	// every instance; nil applies none.
	Rates *quota.TenantRates
	// BudgetPolicy applies to a task whose tenant's budget is spent; a task the project's budget
	// stops always waits, as it is not the tenant's doing.
	BudgetPolicy quota.BudgetPolicy
	// BudgetRetry is how soon a task waiting on its tenant's budget looks again (jittered), capped
	// by the day's reset: a raised budget is honoured without waiting for midnight.
	BudgetRetry time.Duration
	// CacheTTL is how long a cached output is served (store.DefaultOutputTTL when 0).
	CacheTTL time.Duration
	// ContextCaches caches the shared prefix of context_cache families; nil caches none.
	ContextCaches *ContextCaches
}

// WithModelPolicy applies p before every model call.
func WithModelPolicy(p ModelPolicy) Option { return func(h *Handler) { h.mp = p } }

// FlushSpend writes b's tenant spend to the sharded counters every period, and once more when
// ctx ends, so that what was spent during shutdown is counted too. It returns when ctx ends.
func FlushSpend(ctx context.Context, log *slog.Logger, b *quota.Budgets, every time.Duration) {
	flushEvery(ctx, log, every, b.Flush, "tenant spend not flushed")
}

// flushEvery calls flush every period and once more, with a second's grace, when ctx ends; a
// failure is logged as what and retried at the next period. It returns when ctx ends.
func flushEvery(ctx context.Context, log *slog.Logger, every time.Duration, flush func(context.Context) error, what string) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := flush(final); err != nil {
				log.WarnContext(final, what+" at shutdown", "error", err)
			}
			return
		case <-tick.C:
			if err := flush(ctx); err != nil {
				log.WarnContext(ctx, what+"; retried next period", "error", err)
			}
		}
	}
}

// TenantCache reads tenants' limits through the store and keeps them for a refresh period, so
// the hot path does not read the tenant document of every task. Safe for concurrent use.
type TenantCache struct {
	cache *store.Cache[store.Limits]
}

// NewTenantCache returns a TenantCache that re-reads a tenant at most every refresh.
func NewTenantCache(s *store.Store, refresh time.Duration) *TenantCache {
	return &TenantCache{cache: store.NewCache(refresh, func(ctx context.Context, tenant string) (store.Limits, error) {
		t, err := s.GetTenant(ctx, tenant)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return store.Limits{}, nil
		case err != nil:
			return store.Limits{}, fmt.Errorf("limits of tenant %s: %w", tenant, err)
		}
		return t.Limits, nil
	})}
}

// Limits returns tenant's limits: zero (no limit) for a tenant without a document; the last
// known ones when a re-read fails.
func (c *TenantCache) Limits(ctx context.Context, tenant string) (store.Limits, error) {
	return c.cache.Get(ctx, tenant)
}

// answer is how a claimed task got its output.
type answer struct {
	res         gemini.Result
	start       time.Time // the model call's start; zero when no call was made
	cached      bool      // served from outputs/{fingerprint}
	stale       bool      // the tenant's last good output for the subject, every model unavailable
	fingerprint string    // the cache key when the request may be cached, else ""
	// known is the task as this worker last wrote it, when it is known: the commit starts from
	// it instead of reading the task again.
	known *protocol.Task
}

// ticket is a call the policy let through: what it holds of the tenant's budget and rates
// until the call has ended. The run gives it back (run.callOver) whatever ends the call.
type ticket struct {
	hold *quota.Hold
	rate *quota.RateHold
	// admit is the request's gemini Admit when the tenant has an rpm or tpm: it spends rate on
	// the first model call and takes each further call from the tenant's allowance.
	admit func(context.Context, int64) (func(int64), error)
}

// done settles the budget hold with what the call cost and gives the rate hold back whole if no
// model call spent it (admit settles it with what its call used). Only its first call counts:
// each hold settles once.
func (tk *ticket) done(res gemini.Result) {
	if tk.hold != nil {
		tk.hold.Settle(res.CostUSD)
	}
	if tk.rate != nil {
		tk.rate.Settle(0, 0)
	}
}

// cacheKey is the fingerprint of req when the task asked for the cache, its family allows it and
// no Regenerate asked for a fresh generation; else "".
func (h *Handler) cacheKey(t *protocol.Task, r *prompts.Rendered, req gemini.Request) string {
	if !t.Cache || !r.CacheAllowed || t.BypassCache || h.mp.Estimator == nil {
		return ""
	}
	keyed := req
	keyed.Models = h.mp.Estimator.Chain(req)
	return gemini.Fingerprint(t.Tenant, keyed, r.Version)
}

// before runs the policy's steps between the claim and the call, in order: the cache (a hit
// answers without a call), max_cost_usd against the estimate, a model-call slot of the run's
// place (waited for; the lease released when the instance stops taking work first) and the
// tenant's daily budget. It returns a ticket, holding the call slot, when the call may go
// ahead; otherwise it has written the task's outcome (stored, failed, waiting, handed back or
// released), which gave back the slot and the ticket (run.callOver), and the caller stops.
func (r *run) before(ctx context.Context, req gemini.Request, fp string) (*ticket, bool) {
	h, t, log := r.h, r.task, r.log
	if fp != "" {
		o, err := h.store.GetOutput(ctx, t.Tenant, fp)
		switch {
		case err == nil:
			log.InfoContext(ctx, "cache hit; no model call", "fingerprint", fp)
			h.metrics.CacheHit(ctx, t.Family)
			r.persist(ctx, answer{res: gemini.Result{Text: o.Payload, Model: o.Model}, cached: true, fingerprint: fp})
			return nil, false
		case !errors.Is(err, store.ErrNotFound):
			log.WarnContext(ctx, "cache read failed; calling the model", "error", err)
		}
	}
	var worst float64 // what the call may spend, all its attempts counted: the budget holds it
	var tokens int64  // what one call may use: the tenant's tpm holds it
	if h.mp.Estimator != nil {
		var estimate float64
		tokens, estimate = h.mp.Estimator.Estimate(req)
		if req.MaxCostUSD > 0 && estimate > req.MaxCostUSD {
			r.fail(ctx, &protocol.TaskError{Kind: task.KindBudget,
				Message: fmt.Sprintf("estimated $%.6f exceeds max_cost_usd $%.6f; no model call", estimate, req.MaxCostUSD)})
			return nil, false
		}
		worst = h.mp.Estimator.MaxSpend(req)
	}
	if !r.place.startCall(ctx) {
		log.WarnContext(ctx, "shutting down before a model-call slot was free; lease released")
		r.release(ctx)
		return nil, false
	}
	tk := &ticket{}
	r.ticket = tk
	if h.mp.Budgets == nil && h.mp.Rates == nil {
		return tk, true
	}
	limits, err := h.limits(ctx, t.Tenant)
	if err != nil {
		r.handBack(ctx, h.readRetry(), "tenant limits unreadable", err)
		return nil, false
	}
	hold, err := h.reserve(ctx, t.Tenant, limits, worst)
	if err != nil {
		r.overBudget(ctx, err)
		return nil, false
	}
	tk.hold = hold
	if !r.takeRate(ctx, limits, tokens, tk) {
		return nil, false
	}
	return tk, true
}

// limits returns tenant's limits; none without TenantLimits.
func (h *Handler) limits(ctx context.Context, tenant string) (store.Limits, error) {
	if h.mp.Tenants == nil {
		return store.Limits{}, nil
	}
	return h.mp.Tenants.Limits(ctx, tenant)
}

// reserve holds worst, the most a call may spend, against tenant's daily budget — its limits'
// DailyBudgetUSD, else DefaultDailyBudgetUSD — and the project's, failing closed when a total
// cannot be read (quota.Budgets.Reserve). It returns a nil hold without Budgets.
func (h *Handler) reserve(ctx context.Context, tenant string, limits store.Limits, worst float64) (*quota.Hold, error) {
	if h.mp.Budgets == nil {
		return nil, nil
	}
	budget := limits.DailyBudgetUSD
	if budget == 0 {
		budget = h.mp.DefaultDailyBudgetUSD
	}
	return h.mp.Budgets.Reserve(ctx, tenant, budget, worst)
}

// overBudget writes the outcome of a claimed task whose reservation reserve refused, with no
// call made: the project's budget spent, it waits; its tenant's spent, the budget policy
// applies; a total unreadable, it is handed back to try again soon.
func (r *run) overBudget(ctx context.Context, err error) {
	switch {
	case errors.Is(err, quota.ErrProjectBudgetExhausted):
		r.budgetWait(ctx, err, "project daily budget exhausted; waiting")
	case errors.Is(err, quota.ErrBudgetExhausted):
		r.budgetExhausted(ctx, err)
	default:
		r.handBack(ctx, r.h.readRetry(), "tenant budget unreadable", err)
	}
}

// warm starts reading what the model-call policy of a task of tenant (the nudge's attribute; ""
// when it has none) will read — the tenant's limits, its and the project's spend totals — when
// stale, so that the reads overlap the task's claim instead of following it inside a model-call
// slot, where the first tasks of a burst waited on them one after another. The caches read each
// once however many tasks ask, and the others wait for that read: it is not cut short with the
// message's context, whose end would fail their wait too. Errors are left to the policy's own
// reads, which decide.
func (h *Handler) warm(ctx context.Context, tenant string) {
	if tenant == "" || h.mp.Tenants == nil && h.mp.Budgets == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defaulted := h.mp.DefaultDailyBudgetUSD > 0
		var wg sync.WaitGroup
		if h.mp.Tenants != nil {
			wg.Go(func() {
				l, err := h.mp.Tenants.Limits(ctx, tenant)
				if err == nil && !defaulted && l.DailyBudgetUSD > 0 && h.mp.Budgets != nil {
					h.mp.Budgets.Prefetch(ctx, tenant, true)
				}
			})
		}
		if h.mp.Budgets != nil {
			h.mp.Budgets.Prefetch(ctx, tenant, defaulted)
		}
		wg.Wait()
	}()
}

// readRetry is the jittered delay of a task handed back because a store read failed.
func (h *Handler) readRetry() time.Duration { return jitter(h.pol.RetryBase) }

// handBack releases the claim (fenced) before any call, with not_before after wait: no attempt
// is counted, and the task comes back when it is due.
func (r *run) handBack(ctx context.Context, wait time.Duration, why string, cause error) {
	if t, ok := r.outcome(ctx, "hand back", func(t *protocol.Task, now time.Time) {
		r.rules.Requeue(t, r.epoch, now.Add(wait))
	}); ok {
		r.h.metrics.WorkerOutcome(ctx, obs.WorkerDeferred)
		r.log.InfoContext(ctx, why+"; handed back without a call", "not_before", t.NotBefore, "error", cause)
	}
}

// budgetExhausted applies the budget policy: wait (parked until the day resets or BudgetRetry,
// whichever comes first) or fail with kind budget. No model call either way.
func (r *run) budgetExhausted(ctx context.Context, cause error) {
	if r.h.mp.BudgetPolicy == quota.BudgetFail {
		r.fail(ctx, &protocol.TaskError{Kind: task.KindBudget, Message: cause.Error()})
		return
	}
	r.budgetWait(ctx, cause, "tenant daily budget exhausted; waiting")
}

// budgetWait parks the task until the day resets or BudgetRetry, whichever comes first, without
// a call and without counting an attempt.
func (r *run) budgetWait(ctx context.Context, cause error, why string) {
	e := &protocol.TaskError{Kind: task.KindBudget, Message: cause.Error()}
	if t, ok := r.outcome(ctx, "budget wait", func(t *protocol.Task, now time.Time) {
		var retry time.Duration
		if r.h.mp.BudgetRetry > 0 {
			retry = jitter(r.h.mp.BudgetRetry)
		}
		r.rules.BudgetWait(t, r.epoch, now, e, retry)
	}); ok {
		r.h.metrics.WorkerOutcome(ctx, obs.WorkerParked)
		r.log.WarnContext(ctx, why, "not_before", t.NotBefore)
	}
}

// exhausted reports whether no model of req's chain can take a call after a failed one — every
// breaker open, or half-open with its probe in flight (here or in another instance): the task
// waits for the chain like one that found it so (its attempts are not spent on an outage, probes
// included). A generation that ended on a refused breaker says so itself (gemini.ErrUnavailable).
func (h *Handler) exhausted(req gemini.Request) bool {
	return h.mp.Estimator != nil && !h.mp.Estimator.Available(h.mp.Estimator.Chain(req))
}

// unavailable handles a task whose chain is exhausted: a stale family answers with the tenant's
// last good output of the subject; any other task is parked.
func (r *run) unavailable(ctx context.Context, rend *prompts.Rendered, req gemini.Request) {
	if r.stale(ctx, rend) {
		return
	}
	var chain []string
	if r.h.mp.Estimator != nil {
		chain = r.h.mp.Estimator.Chain(req)
	}
	r.park(ctx, chain)
}

// stale answers a task whose chain is exhausted with the tenant's last good output of its
// subject, when its family says on_exhausted: stale. It reports whether it answered.
func (r *run) stale(ctx context.Context, rend *prompts.Rendered) bool {
	h, t, log := r.h, r.task, r.log
	if rend.OnExhausted != prompts.OnExhaustedStale || t.SubjectKey == "" {
		return false
	}
	o, err := h.store.GetLastGood(ctx, t.Tenant, t.Family, t.Variant, t.SubjectKey)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			log.WarnContext(ctx, "last good output unreadable; parking", "error", err)
		}
		return false
	}
	log.WarnContext(ctx, "every model unavailable; answered with the last good output, stale", "model", o.Model)
	h.metrics.WorkerOutcome(ctx, obs.WorkerStale)
	res := r.res
	res.Text, res.Model, res.Degraded = o.Payload, o.Model, true
	r.persist(ctx, answer{res: res, stale: true})
	return true
}

// remember writes, best-effort after the output's commit, the cache entry of a fresh,
// non-degraded output and the last good output of the task's subject — unless the task was
// erased since the commit (store.Remember checks in the same transaction).
func (h *Handler) remember(ctx context.Context, log *slog.Logger, t *protocol.Task, a answer) {
	if a.stale {
		return
	}
	r := store.Remembered{
		Output: store.Output{Tenant: t.Tenant, Payload: t.Output, Model: t.Model, PromptVersion: t.PromptVersion,
			Usage: t.Usage, CostUSD: t.CostUSD, TaskID: t.ID},
		Family: t.Family, Variant: t.Variant, SubjectKey: t.SubjectKey,
	}
	if a.fingerprint != "" && !a.cached && !t.Degraded {
		r.Fingerprint, r.CacheTTL = a.fingerprint, h.mp.CacheTTL
	}
	h.beforeRemember(t)
	switch err := h.store.Remember(ctx, r); {
	case errors.Is(err, store.ErrErased):
		log.InfoContext(ctx, "task erased since its output was stored: no cache entry or last good output written")
	case err != nil:
		log.WarnContext(ctx, "cache entry and last good output not written", "error", err)
	}
}
