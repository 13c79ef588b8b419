package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/genbox-dev/genbox/internal/bench"
)

func runBench(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "bench", "[flags]",
		`Runs a closed-loop workload through genbox in-process on the emulators (reused when
FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST are set) with the fake Gemini, under a failure
mix, and prints throughput and its ratio to the Little's-law bound, end-to-end latency p50/p99
and the overhead above the model's latency, Firestore operations and publishes per task, billed
÷ needed tokens and the peak RSS (--json: the report as JSON); a progress bar runs on stderr when
it is a terminal. --baseline naive runs the same workload and failures through the naive
generate-then-publish pattern, side by side.
--mode batch|flex (--shed F: the fraction of flex requests shed) runs the workload on the
standard tier, then in that mode, and prints cost per task ÷ the standard run's; --context-cache
runs seed 000's shape (a 9k-token shared prefix) with context caching off, then on, and prints
the cost ratio with storage beside the break-even rule's prediction. --backlog submits every task
before the worker takes any, then lets it drain them with --concurrency model-call slots, and
prints the drain's throughput ÷ (slots ÷ mean model latency) beside the same figures. A timed
run is preceded by rounds of fast tasks through the emulators until they stop getting faster
(their JVMs have compiled their hot paths), for --warmup at most.`)
	cfg := bench.DefaultConfig()
	cfg.RegisterFlags(fs)
	asJSON := jsonFlag(fs)
	pos, err := parse(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("bench takes no arguments (see --help)")
	}
	if err := cfg.Validate(); err != nil {
		return usageErr("%v", err)
	}
	if isTerminal(e.stderr) {
		cfg.Progress = e.stderr
	}
	cfg.Getenv = e.getenv
	text := e.stdout
	if *asJSON {
		text = io.Discard
	}
	rep, err := bench.Run(ctx, cfg, text)
	if err != nil {
		if errors.Is(err, bench.ErrConfig) {
			return usageErr("%v", err)
		}
		return fmt.Errorf("bench: %w", err)
	}
	if *asJSON {
		return printJSON(e.stdout, rep)
	}
	return nil
}
