package publisher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/genbox-dev/genbox/internal/httpapi"
	"github.com/genbox-dev/genbox/internal/store"
)

// limiters keeps one submission rate limiter per tenant, in memory per instance. The tenant's
// limits are re-read at most every ttl, so a change applies everywhere within ttl.
type limiters struct {
	st  *store.Store
	ttl time.Duration

	mu  sync.Mutex
	per map[string]*tenantLimiter
}

type tenantLimiter struct {
	lim     *rate.Limiter
	fetched time.Time
}

func newLimiters(st *store.Store, ttl time.Duration) *limiters {
	return &limiters{st: st, ttl: ttl, per: map[string]*tenantLimiter{}}
}

// forget drops a tenant's cached limits (after this instance changed them).
func (l *limiters) forget(tenant string) {
	l.mu.Lock()
	delete(l.per, tenant)
	l.mu.Unlock()
}

func (l *limiters) limiter(ctx context.Context, tenant string, now time.Time) (*rate.Limiter, error) {
	l.mu.Lock()
	tl := l.per[tenant]
	fresh := tl != nil && now.Sub(tl.fetched) < l.ttl // fetched changes under mu
	l.mu.Unlock()
	if fresh {
		return tl.lim, nil
	}
	t, err := l.st.GetTenant(ctx, tenant)
	limits := store.DefaultLimits()
	switch {
	case err == nil:
		limits = t.Limits
	case !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("tenant limits: %w", err)
	}
	lim := rate.Limit(limits.SubmitRate)
	if limits.SubmitRate <= 0 {
		lim = rate.Inf
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if tl = l.per[tenant]; tl == nil {
		tl = &tenantLimiter{lim: rate.NewLimiter(lim, max(limits.SubmitBurst, 1))}
		l.per[tenant] = tl
	} else {
		tl.lim.SetLimitAt(now, lim)
		tl.lim.SetBurstAt(now, max(limits.SubmitBurst, 1))
	}
	tl.fetched = now
	return tl.lim, nil
}

// take takes one submission token of tenant, or returns a 429 problem saying when to retry.
func (l *limiters) take(ctx context.Context, tenant string, now time.Time) error {
	lim, err := l.limiter(ctx, tenant, now)
	if err != nil {
		return err
	}
	res := lim.ReserveN(now, 1)
	if !res.OK() {
		return rateProblem(time.Second)
	}
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return rateProblem(d)
	}
	return nil
}

func rateProblem(after time.Duration) error {
	p := httpapi.Problem(http.StatusTooManyRequests, httpapi.TypeRateLimited, "the tenant's submission rate limit is exceeded")
	p.RetryAfter = max(after, time.Second)
	return p
}
