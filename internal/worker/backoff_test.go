package worker

import (
	"testing"
	"time"
)

// TestBackoffSchedules pins the worker's two not_before schedules at the lowest and highest draw:
// a transient retry is full jitter over its ceiling, a park stays within the upper half of its
// ceiling and so never waits past ParkMax (the liveness bound in docs/liveness.md counts on it).
func TestBackoffSchedules(t *testing.T) {
	t.Parallel()
	p := Policy{RetryBase: 5 * time.Second, RetryMax: 10 * time.Minute, ParkBase: 30 * time.Second, ParkMax: 15 * time.Minute}
	for _, tc := range []struct {
		name     string
		n        int
		low, top time.Duration
		delay    func(n int, rnd func() float64) time.Duration
	}{
		{"retry 1", 1, 0, 5 * time.Second, p.retryBackoff().Delay},
		{"retry 3", 3, 0, 20 * time.Second, p.retryBackoff().Delay},
		{"retry 20, capped", 20, 0, 10 * time.Minute, p.retryBackoff().Delay},
		{"park 1", 1, 15 * time.Second, 30 * time.Second, p.parkBackoff().Delay},
		{"park 3", 3, time.Minute, 2 * time.Minute, p.parkBackoff().Delay},
		{"park 50, capped", 50, 7*time.Minute + 30*time.Second, 15 * time.Minute, p.parkBackoff().Delay},
	} {
		low := tc.delay(tc.n, func() float64 { return 0 })
		top := tc.delay(tc.n, func() float64 { return 1 })
		if low != tc.low || top != tc.top {
			t.Errorf("%s: delays from %v to %v, want from %v to %v", tc.name, low, top, tc.low, tc.top)
		}
	}
}
