package gemini

import (
	"context"
	"math"
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

// bucket paces one quota (requests or tokens) with a token bucket whose rate adapts — cut by half
// on a 429, recovered additively on success, never above its configured rate — and keeps a log of
// what was sent in the last window, as the provider counts it. The bucket spreads calls out; the
// log stops a bunch of calls whose turns passed while the process was descheduled from leaving
// together and overfilling the provider's window.
type bucket struct {
	lim    *rate.Limiter
	max    rate.Limit // the configured rate, per second
	window time.Duration
	cap    float64 // what the log may hold within a window: the paced rate, leaving the headroom for transit jitter
	log    []*sent
}

// sent is one call in a bucket's log; n is settled to what the provider reported.
type sent struct {
	at time.Time
	n  int64
}

// newBucket returns a bucket for perWindow events per window, of which this instance may use
// share, kept under the quota by headroom. Its burst takes half of what the headroom leaves free,
// so that a full bucket plus a window at the steady rate stays under the quota, and the other half
// absorbs the jitter between leaving the client and reaching the provider's window.
func newBucket(perWindow float64, window time.Duration, share, headroom float64) *bucket {
	quota := perWindow * share
	burst := int(math.Floor(quota*(1-headroom)/2 + 1e-9)) // 1e-9: 100*0.2/2 is 9.999… in floats
	if burst < 1 {
		burst = 1
	}
	limit := rate.Limit(quota * headroom / window.Seconds())
	return &bucket{lim: rate.NewLimiter(limit, burst), max: limit, window: window, cap: quota * headroom}
}

// room returns how long until the log has room for n more within a window (0: now). A call
// larger than the whole cap never fits: it goes, and the provider decides.
func (b *bucket) room(now time.Time, n int64) time.Duration {
	i := 0
	for i < len(b.log) && !b.log[i].at.After(now.Add(-b.window)) {
		i++
	}
	b.log = b.log[i:]
	var sum float64
	for _, s := range b.log {
		sum += float64(s.n)
	}
	if sum+float64(n) <= b.cap || float64(n) > b.cap {
		return 0
	}
	for _, s := range b.log {
		if sum -= float64(s.n); sum+float64(n) <= b.cap {
			return s.at.Add(b.window).Sub(now)
		}
	}
	return b.window // unreachable: an empty log has room for anything up to the cap
}

func (b *bucket) record(now time.Time, n int64) *sent {
	s := &sent{at: now, n: n}
	b.log = append(b.log, s)
	return s
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
	logged *sent // the call's entry in the tokens log
}

// acquire waits for the turn of one request of n estimated prompt tokens in both buckets, then
// until both logs have room for it, and records it as sent.
func (l *limiter) acquire(ctx context.Context, clock Clock, n int64) (reservation, error) {
	due, taken := l.reserve(clock, n)
	if wait := due.Sub(clock.Now()); wait > 0 {
		if err := clock.Sleep(ctx, wait); err != nil {
			at := clock.Now()
			for _, r := range taken {
				r.CancelAt(at)
			}
			return reservation{}, err
		}
	}
	for {
		l.mu.Lock()
		now := clock.Now()
		var wait time.Duration
		if l.requests != nil {
			wait = l.requests.room(now, 1)
		}
		if l.tokens != nil {
			wait = max(wait, l.tokens.room(now, n))
		}
		if wait == 0 {
			r := reservation{tokens: n}
			if l.requests != nil {
				l.requests.record(now, 1)
			}
			if l.tokens != nil {
				r.logged = l.tokens.record(now, n)
			}
			l.mu.Unlock()
			return r, nil
		}
		l.mu.Unlock()
		if err := clock.Sleep(ctx, wait); err != nil {
			return reservation{}, err
		}
	}
}

// reserve takes one request and n tokens and returns when the call may go.
func (l *limiter) reserve(clock Clock, n int64) (time.Time, []*rate.Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Read the clock under the lock: a reservation made at a time earlier than the previous one
	// would be granted too early (x/time/rate does not go back in time).
	now := clock.Now()
	var wait time.Duration
	var taken []*rate.Reservation
	for _, b := range []struct {
		b *bucket
		n int64
	}{{l.requests, 1}, {l.tokens, n}} {
		if b.b != nil {
			w, rs := b.b.take(now, b.n)
			wait, taken = max(wait, w), append(taken, rs...)
		}
	}
	return now.Add(wait), taken
}

// settle trues up the tokens reserved with the prompt tokens usageMetadata reported (0 for a call
// the API refused): the difference is returned to, or taken from, the bucket.
func (l *limiter) settle(clock Clock, r reservation, used int64) {
	if l.tokens == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := clock.Now()
	if r.logged != nil {
		r.logged.n = used
	}
	switch {
	case used > r.tokens:
		l.tokens.take(now, used-r.tokens)
	case used < r.tokens:
		l.tokens.give(now, r.tokens-used)
	}
}

// throttled cuts both rates by half after a 429 (multiplicative decrease).
func (l *limiter) throttled(clock Clock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := clock.Now()
	for _, b := range []*bucket{l.requests, l.tokens} {
		if b != nil {
			b.decrease(now)
		}
	}
}

// succeeded recovers both rates additively after a successful call.
func (l *limiter) succeeded(clock Clock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := clock.Now()
	for _, b := range []*bucket{l.requests, l.tokens} {
		if b != nil {
			b.increase(now)
		}
	}
}
