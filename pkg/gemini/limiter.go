package gemini

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// aimdFloor is the lowest fraction of its configured rate a limiter is cut to after 429s, and
// aimdStep the fraction it recovers per successful call.
const (
	aimdFloor = 0.05
	aimdStep  = 0.05
)

// bucket is one token bucket (requests or tokens) whose rate adapts: cut by half on a 429,
// recovered additively on success, never above its configured rate.
type bucket struct {
	lim *rate.Limiter
	max rate.Limit // the configured rate, per second
}

// newBucket returns a bucket for perWindow events per window, of which this instance may use
// share, kept under the quota by headroom. Its burst is what the headroom leaves free, so that
// a full bucket plus a window at the steady rate never exceeds the quota.
func newBucket(perWindow float64, window time.Duration, share, headroom float64) *bucket {
	quota := perWindow * share
	burst := int(quota * (1 - headroom))
	if burst < 1 {
		burst = 1
	}
	limit := rate.Limit(quota * headroom / window.Seconds())
	return &bucket{lim: rate.NewLimiter(limit, burst), max: limit}
}

// take reserves n events at now and returns how long to wait before acting. A reservation larger
// than the burst is taken in burst-sized parts, which queue one behind the other.
func (b *bucket) take(now time.Time, n int64) (time.Duration, []*rate.Reservation) {
	var wait time.Duration
	var rs []*rate.Reservation
	burst := int64(b.lim.Burst())
	for n > 0 {
		part := min(n, burst)
		r := b.lim.ReserveN(now, int(part))
		rs = append(rs, r)
		wait = max(wait, r.DelayFrom(now))
		n -= part
	}
	return wait, rs
}

// give returns n events taken but not used. A negative reservation adds tokens to the bucket
// (capped at its burst on the next reservation): the only way x/time/rate offers to return tokens
// once a reservation has acted. TestBucketGive pins this behaviour of the library.
func (b *bucket) give(now time.Time, n int64) {
	if n > 0 {
		b.lim.ReserveN(now, -int(n))
	}
}

func (b *bucket) decrease(now time.Time) {
	b.lim.SetLimitAt(now, max(b.lim.Limit()/2, b.max*aimdFloor))
}

func (b *bucket) increase(now time.Time) {
	if cur := b.lim.Limit(); cur < b.max {
		b.lim.SetLimitAt(now, min(b.max, cur+b.max*aimdStep))
	}
}

// limiter paces one model's calls by requests and tokens per window. Either bucket may be nil.
type limiter struct {
	mu       sync.Mutex
	requests *bucket
	tokens   *bucket
}

// reservation is what acquire took, to settle after the call.
type reservation struct {
	tokens int64
}

// acquire waits until one request of n estimated prompt tokens fits both buckets.
func (l *limiter) acquire(ctx context.Context, clock Clock, n int64) (reservation, error) {
	now := clock.Now()
	var wait time.Duration
	var taken []*rate.Reservation
	l.mu.Lock()
	if l.requests != nil {
		w, rs := l.requests.take(now, 1)
		wait, taken = max(wait, w), append(taken, rs...)
	}
	if l.tokens != nil {
		w, rs := l.tokens.take(now, n)
		wait, taken = max(wait, w), append(taken, rs...)
	}
	l.mu.Unlock()
	if wait > 0 {
		if err := clock.Sleep(ctx, wait); err != nil {
			at := clock.Now()
			for _, r := range taken {
				r.CancelAt(at)
			}
			return reservation{}, err
		}
	}
	return reservation{tokens: n}, nil
}

// settle trues up the tokens reserved with the prompt tokens usageMetadata reported (0 for a call
// the API refused): the difference is returned to, or taken from, the bucket.
func (l *limiter) settle(now time.Time, r reservation, used int64) {
	if l.tokens == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case used > r.tokens:
		l.tokens.take(now, used-r.tokens)
	case used < r.tokens:
		l.tokens.give(now, r.tokens-used)
	}
}

// throttled cuts both rates by half after a 429 (multiplicative decrease).
func (l *limiter) throttled(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range []*bucket{l.requests, l.tokens} {
		if b != nil {
			b.decrease(now)
		}
	}
}

// succeeded recovers both rates additively after a successful call.
func (l *limiter) succeeded(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range []*bucket{l.requests, l.tokens} {
		if b != nil {
			b.increase(now)
		}
	}
}
