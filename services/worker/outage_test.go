package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

var soak = flag.Bool("soak", false, "run the model outage scenario for 60 s instead of a few")

// counter counts the messages pulled from a subscription, by their alert attribute.
type counter struct {
	mu   sync.Mutex
	keys []string
}

func (c *counter) Handle(_ context.Context, m *bus.Message) bus.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys = append(c.keys, m.Attributes[task.AttrAlert])
	return bus.Ack
}

func (c *counter) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.keys...)
}

// pullInto counts what arrives on subscription until the test ends.
func (s *stack) pullInto(t *testing.T, subscription string) *counter {
	t.Helper()
	c := &counter{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = bus.Pull(ctx, s.ps, subscription, bus.PullSettings{}, c) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// Every model of the chain fails for the whole outage while tasks keep arriving: no task is
// dead-lettered or lost, tasks are parked (waiting), each breaker opening raises exactly one
// alert on genbox-alerts, all tasks succeed after recovery (the sweeper releases the parked ones),
// and the model calls made during the outage stay bounded by the attempts before the breakers
// opened plus their half-open probes. The outage lasts 60 s with -soak, a few seconds otherwise.
func TestModelOutage(t *testing.T) {
	t.Parallel()
	outage := 3 * time.Second
	if *soak {
		outage = 60 * time.Second
	}
	cooldown := outage / 4
	const (
		models          = 2
		breakerFailures = 5
		modelAttempts   = 2
		concurrency     = 4
	)
	s := newStack(t, 0)
	alerts := s.pullInto(t, bus.SubAlerts)
	deadLetters := s.pullInto(t, bus.SubTasksDLQ)
	svc := testenv.Start(t, run, s.env(
		"GENBOX_MODEL_CHAIN", "m1,m2",
		"GENBOX_MAX_ATTEMPTS", "4", "GENBOX_MODEL_ATTEMPTS", fmt.Sprint(modelAttempts),
		"GENBOX_BREAKER_FAILURES", fmt.Sprint(breakerFailures), "GENBOX_BREAKER_COOLDOWN", cooldown.String(),
		"GENBOX_PARK_BASE", "200ms", "GENBOX_PARK_MAX", cooldown.String(),
		"GENBOX_CONCURRENCY", fmt.Sprint(concurrency),
	))
	var ids []string
	submit := func(id string) {
		s.submit(t, id, true)
		ids = append(ids, id)
	}
	submit("before")
	s.waitState(t, 60*time.Second, task.StateSucceeded, "before")

	// The outage lasts at least its duration, and until both breakers are open and a task is
	// parked: on a loaded machine fewer tasks arrive in a few seconds.
	start := time.Now()
	s.fake.Outage("", 24*time.Hour)
	sawWaiting, open := false, false
	for i := 0; time.Since(start) < outage || !open || !sawWaiting; i++ {
		if time.Since(start) > outage+2*time.Minute {
			t.Fatalf("after %s: breakers open %v, a task parked %v\n%s", time.Since(start), open, sawWaiting, tail(svc.Log.String(), 40))
		}
		submit(fmt.Sprintf("during-%02d", i))
		for _, id := range ids {
			if s.get(t, id).State == task.StateWaiting {
				sawWaiting = true
				break
			}
		}
		bs, err := s.store.Breakers(context.Background(), []string{"m1", "m2"})
		if err != nil {
			t.Fatal(err)
		}
		open = bs["m1"].State == string(gemini.BreakerOpen) && bs["m2"].State == string(gemini.BreakerOpen)
		time.Sleep(outage / 15)
	}
	s.fake.Restore("")
	elapsed := time.Since(start)
	during := s.fake.Ledger().Total.Failed // only the outage fails calls
	submit("after")
	s.waitState(t, outage+90*time.Second, task.StateSucceeded, ids...)
	if err := svc.Stop(); err != nil {
		t.Errorf("run: %v", err)
	}

	parked := 0
	for _, id := range ids {
		d := s.get(t, id)
		if n := len(s.fake.Ledger().BillsFor(id)); n != 1 {
			t.Errorf("%s billed %d times, want once", id, n)
		}
		if d.Parks > 0 || d.State == task.StateWaiting {
			parked++
		}
		if d.Attempts >= 5 {
			t.Errorf("%s: %d failed attempts recorded", id, d.Attempts)
		}
	}
	// The last publishes may still be on their way: wait a moment for them to arrive.
	time.Sleep(time.Second)
	if n := len(deadLetters.snapshot()); n != 0 {
		t.Errorf("%d messages on %s, want none", n, bus.TopicTasksDLQ)
	}
	keys := alerts.snapshot()
	want := map[string]bool{"breaker:m1": true, "breaker:m2": true}
	for _, k := range keys {
		if !want[k] {
			t.Errorf("unexpected alert %q (alerts %v)", k, keys)
		}
	}
	if len(keys) != models || keys[0] == keys[len(keys)-1] {
		t.Errorf("alerts %v, want one per breaker opening: one per model", keys)
	}
	// Before the breakers opened: each model's run of failures plus the calls already in flight
	// (each handler may try each model modelAttempts times). Then one half-open probe per model
	// per cooldown.
	bound := models*(breakerFailures+concurrency*modelAttempts) + models*(int(elapsed/cooldown)+1)
	t.Logf("outage %s: %d tasks (%d parked), %d model calls during the outage (bound %d), alerts %v",
		elapsed.Round(100*time.Millisecond), len(ids), parked, during, bound, keys)
	if during > bound {
		t.Errorf("%d model calls during the outage, want at most %d", during, bound)
	}
	if t.Failed() {
		t.Log(tail(svc.Log.String(), 40))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
