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
	Rounds  []float64     // each round's throughput, tasks/s
}

func (w Warmup) String() string {
	if len(w.Rounds) == 0 {
		return "warm-up: none (the emulators as they were)"
	}
	return fmt.Sprintf("warm-up: %d tasks of a %s model through genbox on the emulators first, %s; %d rounds, %.0f → %.0f tasks/s",
		w.Tasks, warmupLatency, dur(w.Elapsed), len(w.Rounds), w.Rounds[0], w.Rounds[len(w.Rounds)-1])
}

// warming decides when the emulators have stopped getting faster: after two rounds in a row
// short of warmupGain × the best round before them (one slow round is noise).
type warming struct {
	best   float64
	misses int
}

// warmupGain is the least a round must improve on the best before it to count as warming.
const warmupGain = 1.05

// add records a round's throughput and reports whether the emulators may still be warming.
func (w *warming) add(throughput float64) bool {
	if throughput >= warmupGain*w.best {
		w.best, w.misses = throughput, 0
		return true
	}
	w.misses++
	return w.misses < 2
}

// warmUp runs rounds of fast tasks through genbox, each in a project of its own — at least one,
// then until the emulators stop getting faster (warming) or cfg.Warmup has passed. The emulators
// are JVMs: on a fresh pair on a 2-core machine, rounds of 500 tasks went from 74 to 130, 154,
// 175, 184, 200, 216, 203, 240 and 223 tasks/s over their first 48 seconds, rounds of 1000 from
// 105 to 339 over a minute, and a run measured meanwhile reads the JIT compiler, not genbox; on a
// pair warm from earlier runs the first rounds are as fast as they get, and the warm-up ends
// after three. A savings run compares costs, which the emulators' speed does not change, and
// warms nothing.
func warmUp(ctx context.Context, cfg Config, emu *emulator.Emulators, suffix string) (Warmup, error) {
	if cfg.Warmup == 0 {
		return Warmup{}, nil
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "warming the emulators, for up to %s (--warmup 0 skips)\n", cfg.Warmup)
	}
	w := DefaultConfig()
	w.Tasks = min(warmupRound, max(warmupConcurrency, int(cfg.Warmup.Seconds()*100)))
	w.Concurrency, w.Latency, w.Distribution, w.InputBytes = warmupConcurrency, warmupLatency, DistFixed, cfg.InputBytes
	w.ModelErrors, w.ResultLoss, w.AckLoss = 0, 0, 0
	w.Seed, w.Timeout, w.Log, w.Getenv = cfg.Seed, cfg.Timeout, cfg.Log, cfg.Getenv
	start := time.Now()
	var out Warmup
	var progress warming
	for {
		r, err := runSystem(ctx, w, emu, systemGenbox, fmt.Sprintf("%s-warmup%d%s", cfg.Project, len(out.Rounds), suffix))
		if err != nil {
			return Warmup{}, fmt.Errorf("warm-up: %w", err)
		}
		out.Tasks += r.Completed
		out.Rounds = append(out.Rounds, r.Throughput)
		if !progress.add(r.Throughput) || time.Since(start) >= cfg.Warmup {
			break
		}
	}
	out.Elapsed = time.Since(start)
	return out, nil
}
