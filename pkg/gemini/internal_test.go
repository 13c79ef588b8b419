package gemini

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/genai"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// TestBucketGive pins the x/time/rate behaviour give relies on: a negative reservation returns
// tokens, capped at the burst.
func TestBucketGive(t *testing.T) {
	t.Parallel()
	b := newBucket(100, time.Second, 1, 0.8) // 80/s, burst 10
	if b.lim.Burst() != 10 {
		t.Fatalf("burst %d, want 10", b.lim.Burst())
	}
	if w, _ := b.take(t0, 10); w != 0 {
		t.Fatalf("full bucket waited %s", w)
	}
	if w, _ := b.take(t0, 4); w != 50*time.Millisecond {
		t.Fatalf("empty bucket: wait %s, want 50ms for 4 tokens at 80/s", w)
	}
	b.give(t0, 4)
	if w, _ := b.take(t0, 4); w != 50*time.Millisecond {
		t.Fatalf("after giving back 4: wait %s, want the same 50ms", w)
	}
	b.give(t0, 1000)
	if got := b.lim.TokensAt(t0); got != 10 {
		t.Errorf("tokens after an oversized give: %v, want capped at the burst 10", got)
	}
}

func TestBucketTakesMoreThanBurstInParts(t *testing.T) {
	t.Parallel()
	b := newBucket(100, time.Second, 1, 0.8) // 80/s, burst 10
	w, rs := b.take(t0, 35)
	if len(rs) != 4 {
		t.Fatalf("%d reservations, want 4 parts of at most 10", len(rs))
	}
	if want := 312500 * time.Microsecond; w != want { // 25 tokens of debt at 80/s
		t.Errorf("wait %s, want %s", w, want)
	}
}

func TestAIMD(t *testing.T) {
	t.Parallel()
	l := &limiter{requests: newBucket(60, time.Minute, 1, 1)}
	clk := &stepClock{now: t0}
	full := l.requests.max
	l.throttled(clk)
	l.throttled(clk)
	if got := l.requests.lim.Limit(); got != full/4 {
		t.Fatalf("after two 429s: %v, want a quarter of %v", got, full)
	}
	for range 100 {
		l.throttled(clk)
	}
	if got := l.requests.lim.Limit(); got != full*aimdFloor {
		t.Fatalf("floor: %v, want %v", got, full*aimdFloor)
	}
	steps := 0
	for l.requests.lim.Limit() < full {
		l.succeeded(clk)
		steps++
	}
	if steps != 19 {
		t.Errorf("recovered in %d successes, want 19 additive steps of 5%%", steps)
	}
	if got := l.requests.lim.Limit(); got != full {
		t.Errorf("recovered to %v, above or below %v", got, full)
	}
}

func TestLimiterLogHoldsBunchedCalls(t *testing.T) {
	t.Parallel()
	b := newBucket(100, time.Second, 1, 0.98) // paced at 98/s, the log holds 98 a window
	for i := range 98 {
		b.record(t0.Add(time.Duration(i)*time.Millisecond), 1)
	}
	if w := b.room(t0.Add(500*time.Millisecond), 1); w != 500*time.Millisecond {
		t.Errorf("full log: wait %s, want 500ms until the oldest call leaves the window", w)
	}
	if w := b.room(t0.Add(time.Second), 1); w != 0 {
		t.Errorf("after the window: wait %s", w)
	}
	if w := b.room(t0.Add(time.Second), 1000); w != 0 {
		t.Errorf("a call larger than the cap waits %s: it would wait forever", w)
	}
}

func TestLimiterWaitsForTheLog(t *testing.T) {
	t.Parallel()
	// Tokens: 1000 a second, paced at 900/s with a burst of 50, the log holds 900.
	l := &limiter{tokens: newBucket(1000, time.Second, 1, 0.9)}
	clk := &stepClock{now: t0}
	for range 10 {
		l.tokens.record(t0, 90) // sent in a bunch, e.g. by calls that overslept
	}
	r, err := l.acquire(context.Background(), clk, 90)
	if err != nil {
		t.Fatal(err)
	}
	if clk.Now().Sub(t0) != time.Second {
		t.Errorf("left after %s, want 1s: when the bunch leaves the window", clk.Now().Sub(t0))
	}
	// A refused call settles to 0: its tokens leave the log and come back to the bucket.
	l.settle(clk, r, 0)
	if got := l.tokens.log[len(l.tokens.log)-1].n; got != 0 {
		t.Errorf("log entry %d after settling a refused call", got)
	}
}

type stepClock struct {
	now    time.Time
	sleeps int
}

func (c *stepClock) Now() time.Time { return c.now }

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.sleeps++
	c.now = c.now.Add(d)
	return ctx.Err()
}

func TestBreakerFailureRatio(t *testing.T) {
	t.Parallel()
	b := newBreaker("m", BreakerConfig{ConsecutiveFailures: 100, Window: time.Minute, FailureRatio: 0.5, MinVolume: 10, Cooldown: time.Second})
	now := t0
	// Alternate failure, failure, success: 2/3 failing, never 3 in a row.
	var opened *BreakerChange
	calls := 0
	for opened == nil && calls < 50 {
		o := outcomeFailure
		if calls%3 == 2 {
			o = outcomeSuccess
		}
		ok, gen, _ := b.allow(now)
		if !ok {
			t.Fatalf("closed breaker refused call %d", calls)
		}
		opened = b.record(now, gen, o)
		calls++
		now = now.Add(time.Second)
	}
	if opened == nil || opened.To != BreakerOpen || calls != 10 {
		t.Fatalf("opened %+v after %d calls, want open at the minimum volume of 10", opened, calls)
	}
	// Old samples leave the window: a success long after does not reopen on stale failures.
	b2 := newBreaker("m", BreakerConfig{ConsecutiveFailures: 100, Window: time.Minute, FailureRatio: 0.5, MinVolume: 4, Cooldown: time.Second})
	for i := range 3 {
		b2.record(t0.Add(time.Duration(i)*time.Second), 0, outcomeFailure)
		b2.record(t0.Add(time.Duration(i)*time.Second), 0, outcomeSuccess)
	}
	if ch := b2.record(t0.Add(10*time.Minute), 0, outcomeFailure); ch != nil {
		t.Errorf("opened on failures outside the window: %+v", ch)
	}
}

func TestNeutralOutcomeReleasesProbe(t *testing.T) {
	t.Parallel()
	b := newBreaker("m", BreakerConfig{ConsecutiveFailures: 1, Window: time.Minute, FailureRatio: 1, MinVolume: 1, Cooldown: time.Second})
	b.record(t0, 0, outcomeFailure)
	now := t0.Add(2 * time.Second)
	ok, gen, ch := b.allow(now)
	if !ok || ch == nil || ch.To != BreakerHalfOpen {
		t.Fatalf("after cooldown: %v %+v", ok, ch)
	}
	if ok, _, _ := b.allow(now); ok {
		t.Fatal("a second probe passed while the first is out")
	}
	if ch := b.record(now, gen, outcomeNeutral); ch != nil {
		t.Fatalf("a 400 moved the breaker: %+v", ch)
	}
	if ok, _, _ := b.allow(now); !ok {
		t.Error("the probe slot was not released after a neutral outcome")
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	retry := []map[string]any{{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2.5s"}}
	for _, tc := range []struct {
		err   error
		class Class
		after time.Duration
	}{
		{genai.APIError{Code: 400}, Permanent, 0},
		{genai.APIError{Code: 401}, Permanent, 0},
		{genai.APIError{Code: 403}, Permanent, 0},
		{genai.APIError{Code: 404}, Permanent, 0},
		{genai.APIError{Code: 408}, Transient, 0},
		{genai.APIError{Code: 429, Details: retry}, Transient, 2500 * time.Millisecond},
		{fmt.Errorf("wrapped: %w", genai.APIError{Code: 503}), Transient, 0},
		{genai.APIError{Code: 500}, Transient, 0},
		{context.DeadlineExceeded, Network, 0},
		{errors.New("read tcp: connection reset by peer"), Network, 0},
	} {
		f := classify(tc.err)
		if f.class != tc.class || f.retryAfter != tc.after {
			t.Errorf("classify(%v) = %s after %s, want %s after %s", tc.err, f.class, f.retryAfter, tc.class, tc.after)
		}
	}
	obj := []map[string]any{{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": map[string]any{"seconds": 3.0, "nanos": 5e8}}}
	if d := retryDelay(obj); d != 3500*time.Millisecond {
		t.Errorf("object retryDelay: %s", d)
	}
}

func TestBackoffIsFullJitter(t *testing.T) {
	t.Parallel()
	c := &Client{cfg: Config{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}}
	for _, tc := range []struct {
		r     float64
		n     int
		after time.Duration
		want  time.Duration
	}{
		{0, 1, 0, 0},
		{0.999, 1, 0, 99900 * time.Microsecond},
		{0.5, 3, 0, 200 * time.Millisecond},
		{0.5, 10, 0, 500 * time.Millisecond}, // capped at BackoffMax
		{0.1, 2, 2 * time.Second, 2 * time.Second},
	} {
		c.rand = func() float64 { return tc.r }
		if got := c.backoff(tc.n, tc.after); got != tc.want {
			t.Errorf("backoff(r=%v, n=%d, after=%s) = %s, want %s", tc.r, tc.n, tc.after, got, tc.want)
		}
	}
}

func TestStatusCodesNotRetriedBySDK(t *testing.T) {
	t.Parallel()
	// The one knob that could make the SDK retry is HTTPRetryOptions; New pins it to one attempt.
	c, err := New(context.Background(), Config{
		Backend: BackendGemini, BaseURL: "http://127.0.0.1:1", Pricing: Pricing{Models: []string{"m"}}, MaxAttempts: 1, ModelAttempts: 1,
		QualityAttempts: 1, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond, CallTimeout: time.Second, FlexCallTimeout: time.Second,
		RateWindow: time.Minute, InstanceShare: 1, RateHeadroom: 1,
		Breaker: BreakerConfig{ConsecutiveFailures: 5, Window: time.Minute, FailureRatio: 0.5, Cooldown: time.Second},
	}, WithHTTPClient(&http.Client{}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Generate(context.Background(), Request{Prompt: "p"})
	if ClassOf(err) != Network || res.Calls != 1 {
		t.Errorf("unreachable endpoint: %v after %d calls, want one network failure", err, res.Calls)
	}
}

// The instance share set at run time sizes the limiters made from then on.
func TestSetInstanceShare(t *testing.T) {
	t.Parallel()
	c := &Client{cfg: Config{RPM: map[string]float64{"m": 100}, RateWindow: time.Minute, RateHeadroom: 0.9},
		limiters: map[string]*limiter{}, share: 1}
	if got := c.limiter("m").requests.cap; got != 90 {
		t.Fatalf("share 1: the log holds %v a window, want 90", got)
	}
	for _, bad := range []float64{0, -1, 1.5} {
		c.SetInstanceShare(bad)
	}
	c.SetInstanceShare(0.25)
	if got := c.limiter("m").requests.cap; got != 22.5 {
		t.Errorf("share 0.25: the log holds %v a window, want 22.5", got)
	}
}
