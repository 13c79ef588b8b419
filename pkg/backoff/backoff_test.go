package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/backoff"
)

func fixed(r float64) func() float64 { return func() float64 { return r } }

func TestCeiling(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Base: time.Second, Max: 10 * time.Second}
	for _, tc := range []struct {
		name string
		p    backoff.Policy
		n    int
		want time.Duration
	}{
		{"first attempt is the base", p, 1, time.Second},
		{"doubles", p, 2, 2 * time.Second},
		{"doubles again", p, 4, 8 * time.Second},
		{"capped", p, 5, 10 * time.Second},
		{"zero attempt counts as the first", p, 0, time.Second},
		{"negative attempt counts as the first", p, -3, time.Second},
		{"attempt past the bits of a Duration", p, 64, 10 * time.Second},
		{"largest attempt", p, math.MaxInt, 10 * time.Second},
		{"base above max is capped", backoff.Policy{Base: time.Minute, Max: time.Second}, 1, time.Second},
		{"max near the largest Duration does not overflow", backoff.Policy{Base: 3, Max: math.MaxInt64}, 1000, math.MaxInt64},
		{"doubling past half the max lands on it", backoff.Policy{Base: 3 * time.Second, Max: 5 * time.Second}, 2, 5 * time.Second},
		{"zero max: no delay", backoff.Policy{Base: time.Second}, 3, 0},
		{"zero base: no delay", backoff.Policy{Max: time.Second}, math.MaxInt, 0},
		{"negative base: no delay", backoff.Policy{Base: -time.Second, Max: time.Second}, 2, 0},
	} {
		if got := tc.p.Ceiling(tc.n); got != tc.want {
			t.Errorf("%s: %+v.Ceiling(%d) = %v, want %v", tc.name, tc.p, tc.n, got, tc.want)
		}
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	full := backoff.Policy{Base: 100 * time.Millisecond, Max: time.Second, Jitter: backoff.Full}
	equal := backoff.Policy{Base: 30 * time.Second, Max: 15 * time.Minute, Jitter: backoff.Equal}
	none := backoff.Policy{Base: 10 * time.Second, Max: 10 * time.Minute, Jitter: backoff.None}
	huge := backoff.Policy{Base: math.MaxInt64 / 2, Max: math.MaxInt64, Jitter: backoff.Full}
	for _, tc := range []struct {
		name string
		p    backoff.Policy
		n    int
		r    float64
		want time.Duration
	}{
		{"full jitter, lowest draw", full, 1, 0, 0},
		{"full jitter, highest draw", full, 1, 1, 100 * time.Millisecond},
		{"full jitter scales the ceiling", full, 3, 0.5, 200 * time.Millisecond},
		{"full jitter, capped ceiling", full, 10, 0.5, 500 * time.Millisecond},
		{"full jitter, below-one draw", full, 1, 0.999, 99900 * time.Microsecond},
		{"equal jitter, lowest draw is half the ceiling", equal, 2, 0, 30 * time.Second},
		{"equal jitter, highest draw is the ceiling", equal, 2, 1, time.Minute},
		{"equal jitter, middle", equal, 1, 0.5, 22500 * time.Millisecond},
		{"equal jitter never passes the cap", equal, 100, 1, 15 * time.Minute},
		{"no jitter ignores the draw", none, 3, 0, 40 * time.Second},
		{"no jitter, capped", none, 30, 0.3, 10 * time.Minute},
		{"draw above one is clamped", full, 2, 7, 200 * time.Millisecond},
		{"draw below zero is clamped", full, 2, -1, 0},
		{"jitter above one is full", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: 3}, 1, 0, 0},
		{"negative jitter is none", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: -1}, 1, 0, time.Second},
		{"the largest ceiling does not round past itself", huge, 5, 1, math.MaxInt64},
		{"zero attempt", full, 0, 1, 100 * time.Millisecond},
	} {
		if got := tc.p.Delay(tc.n, fixed(tc.r)); got != tc.want {
			t.Errorf("%s: %+v.Delay(%d, r=%v) = %v, want %v", tc.name, tc.p, tc.n, tc.r, got, tc.want)
		}
	}
}

// TestDelayNilRand draws from math/rand/v2 and stays within [ceiling·(1−Jitter), ceiling].
func TestDelayNilRand(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: backoff.Equal}
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := p.Delay(3, nil)
		if d < 2*time.Second || d > 4*time.Second {
			t.Fatalf("Delay(3, nil) = %v, want within [2s, 4s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Errorf("Delay(3, nil) drew %d distinct delays in 1000 draws, want them spread", len(seen))
	}
}
