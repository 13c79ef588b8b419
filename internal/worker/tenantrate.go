package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// takeRate takes one request and tokens, the call's worst case, from the tenant's rpm and tpm
// (store.Limits RPM and TPM), shared by every instance (quota.TenantRates), into tk. When there
// is no room but it opens soon (quota.TenantRates.TakeOrWait: within a burst, and fewer calls
// waiting for it here than a lease grants) and one of the instance's places for such waits is
// free (place.rateWait), the task waits for it in process — claimed, its lease renewed, its
// model-call slot given up meanwhile so that other tenants' calls go on — and asks again.
// Otherwise it hands the task back, unclaimed and with no attempt counted, until the time given
// for it — the sweeper finds it then, as any task due — and reports false; likewise, soon, when
// the allowance cannot be leased, and it fails a task whose one call is more than the tenant's
// whole tpm. tk is done by then.
func (r *run) takeRate(ctx context.Context, limits store.Limits, tokens int64, tk *ticket) bool {
	h, t := r.h, r.task
	limit := quota.Rate{Requests: limits.RPM, Tokens: limits.TPM}
	if h.mp.Rates == nil || limit.None() {
		return true
	}
	var (
		hold *quota.RateHold
		at   time.Time
		err  error
	)
	if !r.place.rateWait(func() {
		// The wait ends when the instance stops taking work, as a wait for a call slot does.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(r.place.stop, cancel)()
		hold, at, err = h.mp.Rates.TakeOrWait(wctx, t.Tenant, limit, tokens, r.place.pauseCall,
			func() bool { return r.place.startCall(ctx) })
		if err != nil && wctx.Err() != nil {
			err = quota.ErrRateWaitOff
		}
	}) {
		hold, at, err = h.mp.Rates.Take(ctx, t.Tenant, limit, tokens)
	}
	switch {
	case errors.Is(err, quota.ErrRateWaitOff):
		r.log.WarnContext(ctx, "shutting down while waiting for the tenant's rate; lease released")
		r.release(ctx)
		return false
	case errors.Is(err, quota.ErrRateTooLarge):
		r.fail(ctx, &protocol.TaskError{Kind: task.KindPermanent, Message: err.Error()})
		return false
	case err != nil:
		r.handBack(ctx, h.readRetry(), "tenant rate unreadable", err)
		return false
	case hold == nil && !at.IsZero():
		r.handBack(ctx, max(time.Until(at), 0), "tenant at its rpm or tpm", nil)
		return false
	}
	tk.rate = hold
	if hold != nil {
		tk.admit = h.admitter(t.Tenant, limit, hold)
	}
	return true
}

// admitter is the gemini.Request Admit of a call whose first model call took first: that call
// spends first — unless, made now, the call would count in a later slot than first's
// (quota.RateHold Late): then first is given back and the call takes its own in the slot it
// counts in, however long the steps between take and call lasted —, and each further one — a
// retry, a fallback, a flex call sent again at the standard tier — takes its own from the
// tenant's allowance, waiting for room with the task's lease renewed and its model-call slot
// held, as a retry waits out its backoff. Each is settled with what its call used.
func (h *Handler) admitter(tenant string, limit quota.Rate, first *quota.RateHold) func(context.Context, int64) (func(int64), error) {
	var mu sync.Mutex
	return func(ctx context.Context, tokens int64) (func(int64), error) {
		mu.Lock()
		hold := first
		first = nil
		mu.Unlock()
		if hold != nil && hold.Late() {
			hold.Settle(0, 0)
			hold = nil
		}
		if hold == nil {
			var err error
			if hold, err = h.mp.Rates.Wait(ctx, tenant, limit, tokens); err != nil || hold == nil {
				return func(int64) {}, err
			}
		}
		return func(used int64) { hold.Settle(1, used) }, nil
	}
}

// FlushRates gives back, every period and once more when ctx ends, what this instance holds of
// tenants' rpm and tpm and no longer uses, so that an instance gone quiet keeps none of a
// window's allowance from the others. It returns when ctx ends.
func FlushRates(ctx context.Context, log *slog.Logger, r *quota.TenantRates, every time.Duration) {
	flushEvery(ctx, log, every, r.Flush, "tenant rates not given back")
}
