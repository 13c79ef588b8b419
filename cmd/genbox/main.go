// Command genbox is genbox's command line: `genbox dev` runs the whole stack locally in one
// command; the other verbs drive a genbox deployment (or the dev stack) from a terminal or a
// script — submit, get, list and cancel tasks, decide dead letters, administer tenants, serve the
// fake Gemini or a webhook listener. Run `genbox help` for the verbs and their exit codes.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
