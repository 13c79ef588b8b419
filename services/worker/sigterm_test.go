package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// logLines returns the JSON log lines of out that have task_id id and whose message contains msg.
func logLines(t *testing.T, out, id, msg string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for _, l := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		if m["task_id"] == id && strings.Contains(m["message"].(string), msg) {
			found = append(found, m)
		}
	}
	return found
}

// waitLog polls p's output until a line of task id says msg.
func (p *proc) waitLog(t *testing.T, d time.Duration, id, msg string) {
	t.Helper()
	for deadline := time.Now().Add(d); len(logLines(t, p.out.String(), id, msg)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line of task %q says %q\n%s", id, msg, p.out.String())
		}
	}
}

// sigterm signals p and waits for it to exit on its own, cleanly.
func (p *proc) sigterm(t *testing.T, d time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("worker exited with %v after SIGTERM\n%s", err, p.out.String())
		}
	case <-time.After(d):
		t.Fatalf("worker still running %s after SIGTERM\n%s", d, p.out.String())
	}
}

// readyz answers the process's readiness probe.
func (p *proc) readyz(t *testing.T) int {
	t.Helper()
	var port string
	for deadline := time.Now().Add(10 * time.Second); port == ""; time.Sleep(20 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(p.out.String()); m != nil {
			port = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no address logged\n%s", p.out.String())
		}
	}
	resp, err := http.Get("http://127.0.0.1:" + port + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Logf("/readyz: %d %s", resp.StatusCode, body)
	}
	return resp.StatusCode
}

// midGeneration submits task id and starts worker w1 with shutdown grace grace; it returns once
// w1's model call is held at the fake's gate (released when the test ends).
func (s *stack) midGeneration(t *testing.T, id, grace string) (*proc, *geminitest.Gate) {
	t.Helper()
	gate := s.fake.Block("m")
	t.Cleanup(gate.Release)
	s.submit(t, id, true)
	p := spawn(t, s.env("GENBOX_SHUTDOWN_GRACE", grace, "GENBOX_INSTANCE_ID", "w1"))
	select {
	case <-gate.Entered():
	case <-time.After(60 * time.Second):
		t.Fatalf("the call never started\n%s", p.out.String())
	}
	return p, gate
}

// SIGTERM to a real worker process mid-generation: the call finishes within
// GENBOX_SHUTDOWN_GRACE, so the same worker stores the output and exits; its log says it shut
// down and stored the output, and the task was billed once.
func TestSIGTERMMidGenerationFinishesWithinGrace(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	p, gate := s.midGeneration(t, "term-finish", "30s")
	if code := p.readyz(t); code != http.StatusOK {
		t.Errorf("/readyz while pulling: %d, want 200", code)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.out.String(), `"message":"shutting down"`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no shutdown logged\n%s", p.out.String())
		}
	}
	gate.Release() // the call answers inside the grace period
	p.sigterm(t, 30*time.Second)

	got := s.get(t, "term-finish")
	if got.State != task.StateSucceeded || !got.HasOutput() || got.Lease.Owner != "" {
		t.Errorf("after SIGTERM: state %s output %v lease %+v; want succeeded by w1", got.State, got.HasOutput(), got.Lease)
	}
	if n := len(s.fake.Ledger().BillsFor("term-finish")); n != 1 {
		t.Errorf("billed %d times, want once", n)
	}
	if l := logLines(t, p.out.String(), "term-finish", "output stored"); len(l) != 1 {
		t.Errorf("%d lines of the task say its output was stored, want 1\n%s", len(l), p.out.String())
	}
	if l := logLines(t, p.out.String(), "term-finish", "lease released"); len(l) != 0 {
		t.Errorf("the task was released: %v", l)
	}
}

// SIGTERM to a real worker process whose call cannot finish within GENBOX_SHUTDOWN_GRACE: the
// worker releases the task and exits; its log says so. Another worker then finishes the task.
// Nothing is lost; the abandoned call is billed (the fake bills it as a real invoice would).
func TestSIGTERMMidGenerationReleasesToAnotherWorker(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	p1, gate := s.midGeneration(t, "term-release", "300ms")
	p1.sigterm(t, 30*time.Second)
	p1.waitLog(t, time.Second, "term-release", "lease released")
	if got := s.get(t, "term-release"); got.State != task.StateQueued || got.Lease.Owner != "" || got.Attempts != 0 {
		t.Fatalf("after w1's SIGTERM: state %s lease %+v attempts %d; want queued, released, no attempt counted", got.State, got.Lease, got.Attempts)
	}
	gate.Release()

	p2 := spawn(t, s.env("GENBOX_INSTANCE_ID", "w2"))
	s.waitState(t, 60*time.Second, task.StateSucceeded, "term-release")
	p2.waitLog(t, 10*time.Second, "term-release", "output stored")
	if l := logLines(t, p1.out.String(), "term-release", "output stored"); len(l) != 0 {
		t.Errorf("w1 says it stored the output: %v", l)
	}
	if got := s.get(t, "term-release"); got.Lease.Owner != "" || !got.HasOutput() {
		t.Errorf("w2 left lease %+v output %v", got.Lease, got.HasOutput())
	}
	p2.sigterm(t, 30*time.Second)
}
