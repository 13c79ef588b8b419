package backoff_test

import (
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/pkg/backoff"
)

// A policy's schedule: ceilings doubling from the base to the cap, and the delay drawn below each
// (here with a fixed draw; pass nil, or rand.Float64, for real jitter).
func ExamplePolicy_Delay() {
	p := backoff.Policy{Base: time.Second, Max: 10 * time.Second, Jitter: backoff.Equal}
	half := func() float64 { return 0.5 }
	for n := 1; n <= 5; n++ {
		fmt.Printf("attempt %d: ceiling %v, delay %v\n", n, p.Ceiling(n), p.Delay(n, half))
	}
	// Output:
	// attempt 1: ceiling 1s, delay 750ms
	// attempt 2: ceiling 2s, delay 1.5s
	// attempt 3: ceiling 4s, delay 3s
	// attempt 4: ceiling 8s, delay 6s
	// attempt 5: ceiling 10s, delay 7.5s
}
