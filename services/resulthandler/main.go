// Command resulthandler is genbox's webhook delivery service (DESIGN §6): it consumes
// gemini-results nudges (by push on Cloud Run, or by streaming pull), and delivers each task's
// pending webhook, signed, through the SSRF guard, recording every attempt in Firestore.
// Configuration comes from the environment (see internal/resulthandler.FromEnv).
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
		fmt.Fprintln(os.Stderr, "resulthandler:", err)
		os.Exit(1)
	}
}
