package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/autoscale/runtest"
	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/task"
)

// The simulated pool: slots per instance, the fake model's latency, the largest pool.
const (
	simSlots   = 16
	simLatency = 5 * time.Second
	simMax     = 8
)

// sim is a worker pool autoscaled through a fake Cloud Run Admin API whose instances are this
// package's run, in-process, on the emulators and the fake Gemini.
type sim struct {
	*stack
	fake    *runtest.Server
	pool    string
	publish autoscale.Publisher // wakes the pool, as the publisher's does
	env     map[string]string

	mu   sync.Mutex
	logs map[string]*testenv.LogBuffer
}

func newSim(t testing.TB) *sim {
	t.Helper()
	s := &sim{stack: newStack(t, simLatency), logs: map[string]*testenv.LogBuffer{}}
	s.pool = "projects/" + s.project + "/locations/r/workerPools/genbox-worker"
	s.fake = runtest.New(s.pool, s.start)
	addr, stop, err := s.fake.Serve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	t.Cleanup(func() { s.dump(t) })
	s.env = s.stack.env(
		"GENBOX_AUTOSCALE_POOL", s.pool, "GENBOX_RUN_ADMIN_EMULATOR_HOST", addr,
		"GENBOX_AUTOSCALE_MAX", strconv.Itoa(simMax), "GENBOX_CONCURRENCY", strconv.Itoa(simSlots),
		"GENBOX_AUTOSCALE_INTERVAL", "500ms", "GENBOX_AUTOSCALE_DRAIN_TARGET", "1s", "GENBOX_AUTOSCALE_LATENCY", simLatency.String(),
		"GENBOX_AUTOSCALE_SCALE_IN_AFTER", "2s", "GENBOX_AUTOSCALE_IDLE", "3s", "GENBOX_AUTOSCALE_DRAIN_TIMEOUT", "2m",
		// Leases far above what a loaded machine can delay a renewal by: a lapsed lease is a
		// second generation, which would be counted against the scale-in.
		"GENBOX_LEASE_TTL", "20s", "GENBOX_LEASE_RENEW", "2s",
	)
	// The tenant runs as many tasks at once as the largest pool has slots: the pool, not its
	// cap, is what is measured. A tenant's concurrency holds across the pool's instances.
	testenv.Tenant(t, s.store, "tenant-a")
	if _, err := s.store.SetTenantLimits(context.Background(), "tenant-a", store.Limits{Concurrency: simSlots * simMax}); err != nil {
		t.Fatal(err)
	}
	cfg, err := autoscale.WakeFromEnv(func(k string) string { return s.env[k] })
	if err != nil {
		t.Fatal(err)
	}
	admin, err := autoscale.OpenCloudRun(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	s.publish = autoscale.WakeOnPublish(s.pub, autoscale.NewWaker(cfg, s.store.FS, admin), slog.New(slog.DiscardHandler))
	return s
}

// start runs instance id of the pool; its stop cancels the run's context, as SIGTERM does, and
// waits for it to return.
func (s *sim) start(id string) func() {
	env := map[string]string{}
	for k, v := range s.env {
		env[k] = v
	}
	env["GENBOX_INSTANCE_ID"] = id
	out := &testenv.LogBuffer{}
	s.mu.Lock()
	s.logs[id] = out
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx, func(k string) string { return env[k] }, out); err != nil {
			fmt.Fprintf(os.Stderr, "instance %s: %v\n", id, err)
		}
	}()
	return func() { cancel(); <-done }
}

// dump logs what the instances' autoscalers said, when t failed.
func (s *sim) dump(t testing.TB) {
	t.Helper()
	if !t.Failed() {
		return
	}
	doc := s.store.FS.Collection(autoscale.Collection).Doc("genbox-worker")
	if snap, err := doc.Get(context.Background()); err == nil {
		t.Logf("pool document: %v", snap.Data())
	}
	if snaps, err := doc.Collection("members").Documents(context.Background()).GetAll(); err == nil {
		for _, m := range snaps {
			t.Logf("member: %v", m.Data())
		}
	}
	t.Logf("fake: %d instances, %d running; lives %+v", s.fake.Instances(), s.fake.Running(), s.fake.Lives())
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, out := range s.logs {
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Contains(line, `"component":"autoscaler"`) || strings.Contains(line, `"severity":"ERROR"`) ||
				strings.Contains(line, `"severity":"WARN`) || strings.Contains(line, "shutting down") || strings.Contains(line, "worker started") {
				t.Logf("%s: %s", id, line)
			}
		}
	}
}

// submit writes the tasks ids, eight at a time, then nudges each through the waking publisher.
func (s *sim) submit(t testing.TB, ids []string) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() { defer func() { <-sem }(); s.create(t, id) })
	}
	wg.Wait()
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := s.publish.Publish(context.Background(), bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// create writes a queued task without a callback, as the publisher does: a webhook would keep
// the pool awake for a resulthandler this test does not run.
func (s *sim) create(t testing.TB, id string) {
	t.Helper()
	grace := time.Now().Add(time.Second)
	doc := &protocol.Task{
		ID: id, Tenant: "tenant-a", Family: "summarize", Variant: "default", Input: "The report " + id + " says little.",
		State: task.StateQueued, Delivery: protocol.Delivery{State: task.DeliveryNone}, NudgeAt: &grace,
	}
	if err := s.store.CreateTask(context.Background(), doc); err != nil {
		t.Error(err)
	}
}

// succeeded counts the tasks that succeeded.
func (s *sim) succeeded(t testing.TB) int64 {
	t.Helper()
	n, err := s.store.CountStates(context.Background(), task.StateSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	return n[task.StateSucceeded]
}

// waitFor polls cond every 100 ms until it holds, failing t after bound.
func waitUntil(t testing.TB, bound time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	for deadline := time.Now().Add(bound); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, bound)
		}
	}
	return time.Now()
}

// burstResult is what a burst measured.
type burstResult struct {
	tasks    int
	peak     int           // the most instances running at once
	busy     time.Duration // instance time from the first start to the last success
	drained  time.Duration // from the first start to the last success
	ratio    float64       // tasks ÷ what the instances that ran could have served at most
	asleep   time.Duration // from the last success to the pool back at zero
	wakeUp   time.Duration // a task submitted to the sleeping pool: from its submission to its success
	billed   int           // generations billed by the fake Gemini
	dropped  int           // generations whose client had gone (a cut call)
	forced   int64         // drains that lowered the count with calls in flight
	liveness time.Duration // docs/liveness.md's bound for wakeUp with this test's settings
}

// burst submits n tasks to a pool at zero, waits for every one to succeed and the pool to
// sleep again, then submits one more and waits for it.
func (s *sim) burst(t testing.TB, n int) burstResult {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("burst-%04d", i)
	}
	s.submit(t, ids)
	done := waitUntil(t, 10*time.Minute, fmt.Sprintf("%d tasks succeeded", n), func() bool { return s.succeeded(t) == int64(n) })
	lives := s.fake.Lives()
	first := lives[0].Start
	r := burstResult{tasks: n, drained: done.Sub(first)}
	for _, l := range lives {
		end := l.Stop
		if end.IsZero() || end.After(done) {
			end = done
		}
		if end.After(l.Start) {
			r.busy += end.Sub(l.Start)
		}
	}
	r.peak = peak(lives)
	r.ratio = float64(n) / (r.busy.Seconds() * simSlots / simLatency.Seconds())

	slept := waitUntil(t, 2*time.Minute, "the pool back at zero", func() bool { return s.fake.Instances() == 0 && s.fake.Running() == 0 })
	r.asleep = slept.Sub(done)

	at := time.Now()
	s.submit(t, []string{"after-sleep"})
	r.wakeUp = waitUntil(t, 5*time.Minute, "the task submitted at zero succeeded", func() bool { return s.get(t, "after-sleep").State == task.StateSucceeded }).Sub(at)
	// docs/liveness.md: wake + start + max(pull, lost nudge) + call, the lost nudge being the
	// task's grace (1 s here) or the leader's lease (1 s), then a sweep interval (0.2 s). An
	// instance starting in-process is given 30 s, far above what it takes.
	r.liveness = 30*time.Second + max(time.Second, time.Second) + 200*time.Millisecond + simLatency

	led := s.stack.fake.Ledger()
	r.billed, r.dropped = led.Total.Generations, led.Total.Abandoned
	r.forced = s.forced(t)
	return r
}

// forced reads the pool document's count of forced drains.
func (s *sim) forced(t testing.TB) int64 {
	t.Helper()
	snap, err := s.store.FS.Collection(autoscale.Collection).Doc("genbox-worker").Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, err := snap.DataAt("forced")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := v.(int64)
	return n
}

// peak is the most lives that overlap.
func peak(lives []runtest.Life) int {
	most := 0
	for _, a := range lives {
		n := 0
		for _, b := range lives {
			if !b.Start.After(a.Start) && (b.Stop.IsZero() || b.Stop.After(a.Start)) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// burstSize is the burst of the test and the benchmark: 2,000 tasks, or GENBOX_BENCH_BURST_N.
func burstSize() int {
	if n, err := strconv.Atoi(os.Getenv("GENBOX_BENCH_BURST_N")); err == nil && n > 0 {
		return n
	}
	return 2000
}

// A burst submitted to a pool at zero wakes it and raises it; every task succeeds, billed once;
// no call is cut when the pool drains and shrinks, back to zero once idle; a task submitted to
// the sleeping pool then succeeds within docs/liveness.md's bound. The drain ratio is reported
// (BenchmarkBurst), not asserted.
func TestBurstScalesOutDrainsAndSleeps(t *testing.T) {
	t.Parallel()
	s := newSim(t)
	r := s.burst(t, burstSize())
	t.Logf("%d tasks: peak %d instances, drained in %s over %s of instance time: %.3f of the bound; asleep %s after; a task at zero succeeded in %s (bound %s)",
		r.tasks, r.peak, r.drained.Round(time.Millisecond), r.busy.Round(time.Millisecond), r.ratio, r.asleep.Round(time.Millisecond),
		r.wakeUp.Round(time.Millisecond), r.liveness)
	if r.peak < 2 {
		t.Errorf("the pool peaked at %d instance(s): the burst did not raise it", r.peak)
	}
	if want := r.tasks + 1; r.billed != want || r.dropped != 0 || r.forced != 0 {
		t.Errorf("billed %d generations for %d tasks (billed ÷ needed = %.3f), %d cut, %d forced drains; want %d, 0, 0",
			r.billed, want, float64(r.billed)/float64(want), r.dropped, r.forced, want)
	}
	if r.wakeUp > r.liveness {
		t.Errorf("a task submitted to the pool at zero took %s, past the liveness bound %s", r.wakeUp, r.liveness)
	}
}

// BenchmarkBurst reports how close the pool comes to the bound of the instances it ran: tasks ÷
// (instance-seconds × slots ÷ model latency) from the first instance's start to the last success.
//
//	go test -run '^$' -bench BenchmarkBurst -benchtime 1x ./services/worker
func BenchmarkBurst(b *testing.B) {
	for b.Loop() {
		r := newSim(b).burst(b, burstSize())
		b.ReportMetric(r.ratio, "ratio")
		b.ReportMetric(float64(r.peak), "peak-instances")
		b.ReportMetric(r.drained.Seconds(), "drain-s")
		b.ReportMetric(r.asleep.Seconds(), "to-zero-s")
		b.ReportMetric(r.wakeUp.Seconds(), "wake-s")
		b.ReportMetric(float64(r.billed)/float64(r.tasks+1), "billed/needed")
	}
}
