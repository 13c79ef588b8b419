// Command publisher is genbox's REST API service (DESIGN §8): apps submit, read, list, cancel and
// erase tasks; admins manage tenants, API keys and webhook secrets. Configuration comes from the
// environment (see internal/publisher.FromEnv).
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
		fmt.Fprintln(os.Stderr, "publisher:", err)
		os.Exit(1)
	}
}
