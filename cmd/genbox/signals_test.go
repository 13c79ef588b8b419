package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/testenv"
)

// The first signal cancels the verb's context, with a hint on stderr; only an interrupt makes the
// command exit 130 once the verb has stopped. A second signal stops at once: 130 after Ctrl-C,
// 143 after SIGTERM.
func TestWatchSignals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		first, second os.Signal
		interrupted   bool
		code          int
	}{
		{"interrupt twice", os.Interrupt, os.Interrupt, true, exitInterrupted},
		{"terminate, then interrupt", syscall.SIGTERM, os.Interrupt, false, exitInterrupted},
		{"interrupt, then terminate", os.Interrupt, syscall.SIGTERM, true, exitTerminated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sigs := make(chan os.Signal, 2)
			stopped := make(chan int, 1)
			var stderr testenv.LogBuffer
			ctx, interrupted := watchSignals(context.Background(), sigs, &stderr, func(code int) { stopped <- code })
			sigs <- tc.first
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), errSignal) {
				t.Errorf("cause %v, want errSignal", context.Cause(ctx))
			}
			if interrupted() != tc.interrupted {
				t.Errorf("interrupted() = %v, want %v", interrupted(), tc.interrupted)
			}
			if !strings.Contains(stderr.String(), "press Ctrl-C again to stop at once") {
				t.Errorf("no hint on stderr: %q", stderr.String())
			}
			select {
			case code := <-stopped:
				t.Fatalf("stopped at once (%d) on the first signal", code)
			default:
			}
			sigs <- tc.second
			if code := <-stopped; code != tc.code {
				t.Errorf("hard stop with %d, want %d", code, tc.code)
			}
		})
	}
}

// cliBuild is this command, for the tests that run it as a process.
var cliBuild = testenv.NewBuild("genbox-cli", func(dir string) error {
	return testenv.GoBuild("", "-o", filepath.Join(dir, "genbox"), ".")
})

// genboxBinary builds this command once for the run.
func genboxBinary(t *testing.T) string {
	t.Helper()
	return filepath.Join(cliBuild.Dir(t), "genbox")
}

// listener runs `genbox webhook listen` as a process and returns it once it listens, with its
// address and what it writes on stderr.
func listener(t *testing.T) (cmd *exec.Cmd, addr string, stderr *testenv.LogBuffer, exited <-chan error) {
	t.Helper()
	cmd = exec.Command(genboxBinary(t), "webhook", "listen", "--addr", "127.0.0.1:0", "--secret", "whsec_"+strings.Repeat("QUJD", 8))
	stderr = &testenv.LogBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "listening on http://"); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		t.Fatalf("genbox webhook listen printed no address; stderr:\n%s", stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, addr, stderr, done
}

// waitFor returns once b holds s, or when ctx ends.
func waitFor(ctx context.Context, b *testenv.LogBuffer, s string) error {
	for !strings.Contains(b.String(), s) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// exitOf waits for the process and returns its exit code.
func exitOf(t *testing.T, exited <-chan error) int {
	t.Helper()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(time.Minute):
		t.Fatal("the process did not exit")
		return -1
	}
}

// Ctrl-C stops a verb cleanly and exits 130; SIGTERM stops it cleanly with the verb's own code.
// While the clean stop waits (here on a webhook whose body never comes), a second Ctrl-C stops
// the process at once, still 130.
func TestSignalsEndTheProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the command")
	}
	for name, c := range map[string]struct {
		sig  os.Signal
		code int
	}{"Ctrl-C": {os.Interrupt, exitInterrupted}, "SIGTERM": {syscall.SIGTERM, exitOK}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd, _, stderr, exited := listener(t)
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			if code := exitOf(t, exited); code != c.code {
				t.Errorf("exit %d after %s, want %d\n%s", code, name, c.code, stderr.String())
			}
		})
	}
	t.Run("Ctrl-C twice", func(t *testing.T) {
		t.Parallel()
		cmd, addr, stderr, exited := listener(t)
		held, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		// A request whose body never arrives: the listener's shutdown waits for it. The server
		// answers 100 Continue once the handler reads the body, so the request is in hand then.
		if _, err := fmt.Fprintf(held, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(held).ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
			t.Fatalf("the listener answered %q (%v), want 100 Continue", line, err)
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := waitFor(ctx, stderr, "press Ctrl-C again"); err != nil {
			t.Fatalf("no hint after the first Ctrl-C: %v\n%s", err, stderr.String())
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if code := exitOf(t, exited); code != exitInterrupted || !strings.Contains(stderr.String(), "stopped at once") {
			t.Errorf("exit %d after a second Ctrl-C, want %d and a stop at once\n%s", code, exitInterrupted, stderr.String())
		}
	})
}
