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

	"github.com/genbox-dev/genbox/internal/emulator"
)

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, interrupted := watchSignals(context.Background(), sigs, os.Stderr, func(code int) {
		emulator.StopAll() // in their own process groups, they would outlive this process
		os.Exit(code)
	})
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	if interrupted() {
		code = exitInterrupted
	}
	os.Exit(code)
}
