// Package backoff owns genbox's one retry schedule: an exponential ceiling that doubles from a
// base up to a cap, and a uniform draw below it. Every delay genbox waits before trying again —
// the REST client's and the model client's retries, a task's retry and park, webhook and Slack
// retries, the sweeper's re-nudges — is a Policy. It is public (under pkg/) because pkg/client and
// pkg/gemini use it and cannot import internal packages. The functions are pure: the randomness
// is passed in, so a schedule can be tested exactly.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jitter values: the share of the ceiling that is drawn at random.
const (
	None  = 0.0 // the ceiling itself: a deterministic schedule
	Equal = 0.5 // uniform in [ceiling/2, ceiling]: never much sooner than the ceiling
	Full  = 1.0 // uniform in [0, ceiling]: spreads a herd of retries the most
)

// Policy is a capped exponential backoff. The ceiling of attempt n (1-based) is Base·2^(n-1),
// capped at Max; the delay is drawn uniformly from [ceiling·(1−Jitter), ceiling].
type Policy struct {
	Base   time.Duration // ceiling of the first attempt
	Max    time.Duration // cap on every ceiling, and so on every delay; zero or less: no delay
	Jitter float64       // share of the ceiling drawn at random, from None (0) to Full (1)
}

// Ceiling is the largest delay before attempt n: Base·2^(n-1) capped at Max. Attempts below 1
// count as the first; the doubling stops at Max, so no attempt overflows.
func (p Policy) Ceiling(n int) time.Duration {
	c := max(min(p.Base, p.Max), 0)
	for i := 1; i < n && c > 0 && c < p.Max; i++ {
		if c > p.Max/2 {
			c = p.Max
		} else {
			c *= 2
		}
	}
	return c
}

// Delay is the wait before attempt n: the ceiling less a random share Jitter·(1−r) of it, where r
// is rnd's draw from [0, 1] (values outside are clamped). With r = 1 it is the ceiling, with
// r = 0 the ceiling·(1−Jitter). A nil rnd draws from math/rand/v2.
func (p Policy) Delay(n int, rnd func() float64) time.Duration {
	c := p.Ceiling(n)
	j := min(max(p.Jitter, 0), 1)
	if c == 0 || j == 0 {
		return c
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	r := min(max(rnd(), 0), 1)
	d := float64(c) * (1 - j + j*r)
	if d >= float64(c) { // also keeps a ceiling near the largest Duration from rounding past it
		return c
	}
	return time.Duration(d)
}
