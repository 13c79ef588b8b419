package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/internal/emulator"
)

// The warm-up's workload: rounds of fast tasks, no failures, so that in a given time every
// Firestore and Pub/Sub request of the path reaches the emulators as often as it can. A round
// has 100 tasks per second of the warm-up, at least warmupConcurrency and at most warmupRound.
const (
	warmupRound       = 1000 // tasks of a round at most
	warmupConcurrency = 64
	warmupLatency     = 10 * time.Millisecond
)

// Warmup is what was put through the emulators before a timed run.
type Warmup struct {
	Tasks   int           // tasks completed
	Elapsed time.Duration // the warm-up's wall time
}

func (w Warmup) String() string {
	if w.Tasks == 0 {
		return "warm-up: none (the emulators as they were)"
	}
	return fmt.Sprintf("warm-up: %d tasks of a %s model through genbox on the emulators first, %s", w.Tasks, warmupLatency, dur(w.Elapsed))
}

// warmUp runs rounds of fast tasks through genbox, each in a project of its own, at least one
// and until cfg.Warmup has passed. The emulators are JVMs: on a fresh pair, rounds of this workload
// on a 2-core machine went from 74 to 130, 154, 175, 200 and 220 tasks/s over their first 40
// seconds, and a backlog drain measured then reads the JIT compiler, not genbox. A savings run
// compares costs, which the emulators' speed does not change, and warms nothing.
func warmUp(ctx context.Context, cfg Config, emu *emulator.Emulators, suffix string) (Warmup, error) {
	if cfg.Warmup == 0 {
		return Warmup{}, nil
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "warming the emulators for %s (--warmup 0 skips)\n", cfg.Warmup)
	}
	w := DefaultConfig()
	w.Tasks = min(warmupRound, max(warmupConcurrency, int(cfg.Warmup.Seconds()*100)))
	w.Concurrency, w.Latency, w.Distribution, w.InputBytes = warmupConcurrency, warmupLatency, DistFixed, cfg.InputBytes
	w.ModelErrors, w.ResultLoss, w.AckLoss = 0, 0, 0
	w.Seed, w.Timeout, w.Log, w.Getenv = cfg.Seed, cfg.Timeout, cfg.Log, cfg.Getenv
	start := time.Now()
	var out Warmup
	for round := 0; round == 0 || time.Since(start) < cfg.Warmup; round++ {
		r, err := runSystem(ctx, w, emu, systemGenbox, fmt.Sprintf("%s-warmup%d%s", cfg.Project, round, suffix))
		if err != nil {
			return Warmup{}, fmt.Errorf("warm-up: %w", err)
		}
		out.Tasks += r.Completed
	}
	out.Elapsed = time.Since(start)
	return out, nil
}
