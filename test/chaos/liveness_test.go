package chaos_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/dlqnotifier"
	"github.com/genbox-dev/genbox/internal/resulthandler"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// serviceTimings are the variables of the durations that decide how soon a crashed stack carries
// its tasks again; a scenario that deletes them runs the services' own defaults.
var serviceTimings = []string{
	"GENBOX_LEASE_TTL", "GENBOX_LEASE_RENEW", "GENBOX_MAX_EXTENSION",
	"GENBOX_SWEEP_INTERVAL", "GENBOX_SWEEP_LEADER_TTL", "GENBOX_SWEEP_BACKOFF_BASE", "GENBOX_SWEEP_BACKOFF_MAX",
	"GENBOX_NUDGE_GRACE", "GENBOX_RETRY_BASE", "GENBOX_RETRY_MAX", "GENBOX_PARK_BASE", "GENBOX_PARK_MAX",
	"GENBOX_BREAKER_COOLDOWN", "GENBOX_SHUTDOWN_GRACE",
}

// withServiceTimings makes every process of s run the services' default durations.
func (s *stack) withServiceTimings() {
	for _, p := range s.procs {
		for _, k := range serviceTimings {
			delete(p.env, k)
		}
	}
}

// killAll SIGKILLs every service process at once, as a machine that loses power would, and
// returns once each has been started again by its supervisor.
func (s *stack) killAll() time.Time {
	s.t.Helper()
	before := map[string]int{}
	for name, p := range s.procs {
		p.mu.Lock()
		before[name] = p.restarts
		p.mu.Unlock()
		p.kill()
	}
	deadline := time.Now().Add(30 * time.Second)
	for name, p := range s.procs {
		for {
			p.mu.Lock()
			up := p.restarts > before[name] && p.cmd != nil && p.cmd.ProcessState == nil
			p.mu.Unlock()
			if up {
				break
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("%s not restarted after the kill", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return time.Now()
}

// pushTopology is the chaos topology with the resulthandler and the dlqnotifier consuming by push
// on fixed ports, as they are deployed; consumeByPush points their processes at those ports. A
// killed pull subscriber's stream is kept by the Pub/Sub emulator and keeps taking messages it
// never acks: a push endpoint that is down is retried instead, as Pub/Sub does in production.
func pushTopology(t *testing.T, top bus.Topology) (bus.Topology, map[string]string) {
	t.Helper()
	ports := map[string]string{svcResultHandler: freePort(t), svcDLQNotifier: freePort(t)}
	rh := "http://127.0.0.1:" + ports[svcResultHandler] + resulthandler.PushPath
	dlq := "http://127.0.0.1:" + ports[svcDLQNotifier] + dlqnotifier.PushPath
	top.PushEndpoints = map[string]string{bus.SubResults: rh, bus.SubTasksDLQ: dlq, bus.SubResultsDLQ: dlq, bus.SubAlerts: dlq}
	return top, ports
}

func (s *stack) consumeByPush(ports map[string]string) {
	for svc, port := range ports {
		s.procs[svc].env["PORT"] = port
		s.procs[svc].env["GENBOX_CONSUMER"] = "push"
	}
}

// The whole stack — all four services — is SIGKILLed four times in the first seconds of a
// 30-task run whose tenant may run 10 tasks at once, with the services' default durations: the
// tasks over the cap are handed back with a short not_before just before a kill, others are
// claimed or mid-call. Every task succeeds within 60 s of the last restart, and the only extra
// generations are the calls the kills cut short.
func TestWholeStackKilled(t *testing.T) {
	t.Parallel()
	const tasks, kills = 30, 4
	top, ports := pushTopology(t, bus.DefaultTopology())
	s := newStackOn(t, geminitest.Uniform(time.Second, 3*time.Second), "", top)
	s.consumeByPush(ports)
	s.withServiceTimings()
	// Each worker process is a new instance (hostname-pid), as a restarted container is: the
	// sweeper's leadership of a killed one is taken over only once its lease has expired.
	delete(s.procs[svcWorker].env, "GENBOX_INSTANCE_ID")
	s.start()
	s.submit(tasks, "killall")
	s.logf("%d tasks submitted", tasks)
	var last time.Time
	for i := range kills {
		time.Sleep(1500 * time.Millisecond)
		last = s.killAll()
		s.logf("kill %d: every service SIGKILLed and restarted", i+1)
	}
	const within = 60 * time.Second
	ctx := context.Background()
	s.mu.Lock()
	subs := append([]submitted(nil), s.tasks...)
	s.mu.Unlock()
	deadline := last.Add(within)
	var slowest time.Duration
	for _, sub := range subs {
		for {
			doc, err := s.store.GetTask(ctx, sub.id)
			if err != nil {
				t.Fatal(err)
			}
			if doc.State == task.StateSucceeded {
				slowest = max(slowest, doc.CompletedAt.Sub(last))
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("task %s (%s) not succeeded %s after the last restart: %s", sub.id, sub.marker, within, describe(doc))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	s.logf("every task succeeded; the last %s after the last restart", slowest.Round(100*time.Millisecond))
	o := s.checkInvariants(within, tasks*kills)
	// A kill costs the calls it cut short, and nothing else: after the last restart no task is
	// paid twice. (Each kill may cut as many calls short as the tenant runs at once.)
	led := s.fake.Ledger()
	before := 0
	for _, sub := range subs {
		after := 0
		for _, b := range led.BillsFor(sub.marker) {
			if b.Started.Before(last) {
				before++
			} else {
				after++
			}
		}
		if after > 1 {
			t.Errorf("task %s (%s) billed %d times after the last restart", sub.id, sub.marker, after)
		}
	}
	t.Logf("%d kills: %d generations for %d tasks (%d extra), %d started before the last restart (%d cut short); slowest task %s after the last restart",
		kills, o.Generations, o.Tasks, o.Generations-o.Tasks, before, led.Total.Abandoned, slowest.Round(100*time.Millisecond))
}

// describe is what a stuck task's document says about why nobody carries it.
func describe(d *store.Task) string {
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.Format(time.StampMilli)
	}
	return fmt.Sprintf("state %s attempts %d claims %d not_before %s nudges %d nudge_at %s due_at %s lease %s/%d until %s updated %s",
		d.State, d.Attempts, d.Claims, at(d.NotBefore), d.Nudges, at(d.NudgeAt), at(d.DueAt), d.Lease.Owner, d.Lease.Epoch, at(d.Lease.ExpiresAt), d.UpdatedAt.Format(time.StampMilli))
}
