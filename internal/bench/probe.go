package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// probeCallers is how many calls at once probeCalls keeps going beside a drain: few enough to
// add next to nothing to the drain's load.
const probeCallers = 2

// probeCalls measures what a model call costs a caller beyond the model's latency on this
// machine while a drain runs — the request's and the answer's way through the SDK, HTTP and
// loopback, and the wake-ups of the threads that wait for them —, which a slot holds as it holds
// the call: probeCallers callers make calls of a fixed latency back to back, through pkg/gemini
// (the client the worker calls the model with) to a fake of their own, so the run's ledger counts
// none of them, with inputs of inputBytes, until stop is closed. The returned wait gives the
// mean of each call's duration less the latency.
func probeCalls(ctx context.Context, latency time.Duration, inputBytes int, stop <-chan struct{}) (wait func() (time.Duration, error), err error) {
	srv := geminitest.NewServer(geminitest.WithLatency(benchModel, geminitest.Fixed(latency)))
	cfg := gemini.DefaultConfig()
	cfg.BaseURL, cfg.Models = srv.URL, []string{benchModel}
	c, err := gemini.New(ctx, cfg)
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("probe the model call: %w", err)
	}
	var (
		mu       sync.Mutex
		sum      time.Duration
		n        int
		firstErr error
		wg       sync.WaitGroup
	)
	for caller := range probeCallers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				start := time.Now()
				_, err := c.Generate(ctx, gemini.Request{TaskID: fmt.Sprintf("probe-%d-%d", caller, i), Tenant: benchTenant, Prompt: input(taskID(i), inputBytes)})
				took := time.Since(start)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				} else if err == nil {
					sum += took - latency
					n++
				}
				mu.Unlock()
			}
		})
	}
	return func() (time.Duration, error) {
		wg.Wait()
		srv.Close()
		if firstErr != nil {
			return 0, fmt.Errorf("probe the model call: %w", firstErr)
		}
		if n == 0 {
			return 0, nil
		}
		return sum / time.Duration(n), nil
	}, nil
}
