// Command worker is genbox's worker service (DESIGN §4): it pulls gemini-tasks, claims each task
// under a fenced lease, calls Gemini, persists the output before acking, and runs the
// leader-elected sweeper that carries whatever is due. Configuration comes from the environment
// (see internal/worker.FromEnv).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
