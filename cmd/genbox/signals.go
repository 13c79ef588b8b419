package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"
)

// Exit codes after a signal, as a shell reports a process the signal ended: 128 + its number.
const (
	exitInterrupted = 128 + int(syscall.SIGINT)  // Ctrl-C
	exitTerminated  = 128 + int(syscall.SIGTERM) // a second SIGTERM
)

// errSignal is the cause of the context a first signal cancels.
var errSignal = errors.New("genbox: stopped by a signal")

// watchSignals returns a context that the first signal on sigs cancels, so the verb stops
// cleanly (genbox dev shuts its stack and emulators down), and reports whether that signal was
// an interrupt (Ctrl-C): the command then exits 130. A second signal does not wait for the clean
// stop: hardStop exits at once with 130 (or 143 for SIGTERM).
func watchSignals(parent context.Context, sigs <-chan os.Signal, stderr io.Writer, hardStop func(code int)) (ctx context.Context, interrupted func() bool) {
	ctx, cancel := context.WithCancelCause(parent)
	var interrupt atomic.Bool
	go func() {
		sig := <-sigs
		interrupt.Store(sig == os.Interrupt)
		fmt.Fprintf(stderr, "\ngenbox: %v: stopping; press Ctrl-C again to stop at once\n", sig)
		cancel(fmt.Errorf("%w (%v)", errSignal, sig))
		sig = <-sigs
		fmt.Fprintf(stderr, "genbox: %v again: stopped at once\n", sig)
		code := exitInterrupted
		if sig == syscall.SIGTERM {
			code = exitTerminated
		}
		hardStop(code)
	}()
	return ctx, interrupt.Load
}
