// Command dlqnotifier is genbox's human gate (DESIGN §7): it posts dead letters and alerts to
// Slack, takes approvers' decisions at /slack/interactions and operators' at /admin/dead-letters,
// and consumes gemini-tasks-dlq, gemini-results-dlq and genbox-alerts by push (Cloud Run) or pull.
// Configuration comes from the environment (see internal/dlqnotifier.FromEnv).
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
		fmt.Fprintln(os.Stderr, "dlqnotifier:", err)
		os.Exit(1)
	}
}
