package autoscale_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/autoscale"
	"github.com/genbox-dev/genbox/internal/autoscale/runtest"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// pool is a test's worker pool: a fake Admin API whose instances are members that each hold one
// call from their start until release is closed, and count the calls cut by a stop.
type pool struct {
	cfg     autoscale.Config
	store   *store.Store
	fake    *runtest.Server
	admin   *autoscale.CloudRun
	release chan struct{}
	end     sync.Once    // closes release
	calling atomic.Int64 // calls in flight, over every instance
	cut     atomic.Int64 // instances stopped while their call was in flight
	share   atomic.Value // the last quota share a member was given
}

func setup(t *testing.T) *pool {
	t.Helper()
	id := emulator.ProjectID(t)
	p := &pool{store: store.New(testenv.Firestore(t, id)), release: make(chan struct{})}
	p.cfg = autoscale.Config{
		Pool: "projects/" + id + "/locations/r/workerPools/genbox-worker", Min: 0, Max: 3, Interval: 100 * time.Millisecond,
		Headroom: 1.25, DrainTarget: time.Second, ScaleInAfter: 300 * time.Millisecond, IdleAfter: 500 * time.Millisecond,
		DrainTimeout: time.Minute, Latency: time.Second, Slots: 1,
	}
	p.fake = runtest.New(p.cfg.Pool, p.instance)
	addr, stop, err := p.fake.Serve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	p.cfg.AdminEmulator = addr
	if p.admin, err = autoscale.OpenCloudRun(context.Background(), p.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.admin.Close() })
	t.Cleanup(p.releaseCalls) // before the instances stop, should the test fail with calls held
	return p
}

// instance starts a member named id whose pull makes one call, held until release, then waits
// for its context to end.
func (p *pool) instance(id string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var inCall atomic.Bool
	m := autoscale.NewMember(p.cfg, p.store.FS, id, func() autoscale.Load { return autoscale.Load{Slots: 1} },
		func(s float64) { p.share.Store(s) }, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	called := false
	go func() {
		defer close(done)
		_ = m.Gate(func(pctx context.Context) error {
			if !called {
				called = true
				inCall.Store(true)
				p.calling.Add(1)
				<-p.release // the call outlives the pull's context, as a worker's does
				p.calling.Add(-1)
				inCall.Store(false)
			}
			<-pctx.Done()
			return nil
		})(ctx)
	}()
	return func() {
		if inCall.Load() {
			p.cut.Add(1)
		}
		cancel()
		<-done
	}
}

// releaseCalls lets every held call end.
func (p *pool) releaseCalls() { p.end.Do(func() { close(p.release) }) }

// tasks writes n task documents in state.
func (p *pool) tasks(t *testing.T, state string, n int) {
	t.Helper()
	for i := range n {
		if _, err := p.store.Tasks().Doc(fmt.Sprintf("t%d", i)).Set(context.Background(), map[string]any{"state": state}); err != nil {
			t.Fatal(err)
		}
	}
}

// until steps c every Interval until cond holds, failing t after a generous bound.
func until(t *testing.T, c *autoscale.Controller, p *pool, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(p.cfg.Interval) {
		if time.Now().After(deadline) {
			t.Fatalf("never %s", what)
		}
		if err := c.Step(context.Background()); err != nil {
			t.Logf("step: %v", err)
		}
	}
}

func (p *pool) state(t *testing.T) autoscale.State {
	t.Helper()
	var st autoscale.State
	snap, err := p.store.FS.Collection(autoscale.Collection).Doc("genbox-worker").Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.DataTo(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A pool at zero is woken by a task's nudge; the backlog raises it to max, and every instance
// takes its share of the quota; with nothing left to do it drains, but the count stays up while
// a call is in flight, and drops to zero only once every call ended: no call is cut.
func TestScaleOutDrainAndSleep(t *testing.T) {
	t.Parallel()
	p := setup(t)
	c := autoscale.NewController(p.cfg, p.store, p.admin, "leader", slog.New(slog.DiscardHandler))
	p.tasks(t, "running", 3)

	w := autoscale.NewWaker(p.cfg, p.store.FS, p.admin)
	var sent []string
	pub := autoscale.WakeOnPublish(publishFunc(func(topic string) { sent = append(sent, topic) }), w, slog.New(slog.DiscardHandler))
	if _, err := pub.Publish(context.Background(), "gemini-tasks", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := p.fake.Instances(); got != 1 || len(sent) != 1 {
		t.Fatalf("after a nudge of a pool at zero: %d instances, %v published; want 1 and the nudge", got, sent)
	}

	until(t, c, p, "scaled out to 3 with every call in flight", func() bool { return p.fake.Instances() == 3 && p.calling.Load() == 3 })
	until(t, c, p, "a share of a third", func() bool { s, _ := p.share.Load().(float64); return math.Abs(s-1.0/3) < 1e-9 })

	p.tasks(t, "succeeded", 3)
	until(t, c, p, "draining", func() bool { return p.state(t).Draining })
	for range 5 { // the drain waits on the calls however many steps pass
		if err := c.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(p.cfg.Interval)
	}
	if got := p.fake.Instances(); got != 3 {
		t.Fatalf("the count was lowered to %d with 3 calls in flight", got)
	}
	p.releaseCalls()
	until(t, c, p, "asleep", func() bool { return p.fake.Instances() == 0 && !p.state(t).Draining })
	var wg sync.WaitGroup
	wg.Go(func() {
		for deadline := time.Now().Add(30 * time.Second); p.fake.Running() > 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		}
	})
	wg.Wait()
	if st := p.state(t); p.cut.Load() != 0 || st.Forced != 0 || st.Instances != 0 {
		t.Errorf("cut %d calls, forced %d drains, document at %d instances; want 0, 0, 0", p.cut.Load(), st.Forced, st.Instances)
	}
}

// A wake never shrinks a pool: one Terraform made at two instances, which no controller has
// written the document of yet, keeps them, and the document learns its count.
func TestWakeNeverShrinks(t *testing.T) {
	t.Parallel()
	p := setup(t)
	p.releaseCalls()
	if err := p.admin.SetInstances(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if err := autoscale.NewWaker(p.cfg, p.store.FS, p.admin).Wake(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, st := p.fake.Instances(), p.state(t); got != 2 || st.Instances != 2 || st.WakeAt == nil {
		t.Errorf("after a wake: pool at %d, document %+v; want 2 and 2 with the wake recorded", got, st)
	}
}

// A drain waiting on calls in flight is called off when the backlog grows again: the members
// resume and the count never drops.
func TestDrainCalledOffWhenTheBacklogGrows(t *testing.T) {
	t.Parallel()
	p := setup(t)
	c := autoscale.NewController(p.cfg, p.store, p.admin, "leader", slog.New(slog.DiscardHandler))
	p.tasks(t, "running", 3)
	until(t, c, p, "scaled out to 3 with every call in flight", func() bool { return p.fake.Instances() == 3 && p.calling.Load() == 3 })
	p.tasks(t, "succeeded", 2) // one running task asks for ⌈1.25⌉ = 2 instances
	until(t, c, p, "draining to 2", func() bool { st := p.state(t); return st.Draining && st.Target == 2 })
	p.tasks(t, "running", 3)
	until(t, c, p, "the drain called off", func() bool { return !p.state(t).Draining })
	if got := p.fake.Instances(); got != 3 || p.cut.Load() != 0 {
		t.Errorf("after the drain was called off: %d instances, %d calls cut; want 3, 0", got, p.cut.Load())
	}
}

// A wake during a drain to zero, before the count was lowered, calls the drain off and leaves
// the count alone: the instances resume.
func TestWakeCallsOffADrainToZero(t *testing.T) {
	t.Parallel()
	p := setup(t)
	c := autoscale.NewController(p.cfg, p.store, p.admin, "leader", slog.New(slog.DiscardHandler))
	p.tasks(t, "running", 1) // ⌈1.25⌉ = 2 instances
	until(t, c, p, "scaled out to 2", func() bool { return p.fake.Instances() == 2 && p.calling.Load() == 2 })
	p.tasks(t, "succeeded", 1)
	until(t, c, p, "draining to zero", func() bool { st := p.state(t); return st.Draining && st.Target == 0 })
	if err := autoscale.NewWaker(p.cfg, p.store.FS, p.admin).Wake(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := p.state(t); st.Draining || st.WakeAt == nil || p.fake.Instances() != 2 {
		t.Errorf("after the wake: document %+v, %d instances; want the drain off, the wake recorded, 2 instances", st, p.fake.Instances())
	}
}

type publishFunc func(topic string)

func (f publishFunc) Publish(_ context.Context, topic string, _ []byte, _ map[string]string) (string, error) {
	f(topic)
	return "id", nil
}

// A schedule that is not paused or a re-run still running keeps one instance: the workers fire
// schedules and pace re-runs, so a pool at zero would miss the fires and stall the re-run. Each
// of them alone keeps the pool up; with neither, it sleeps.
func TestSchedulesAndRerunsKeepAnInstance(t *testing.T) {
	t.Parallel()
	p := setup(t)
	p.releaseCalls()
	c := autoscale.NewController(p.cfg, p.store, p.admin, "leader", slog.New(slog.DiscardHandler))
	ctx := context.Background()
	if err := autoscale.NewWaker(p.cfg, p.store.FS, p.admin).Wake(ctx); err != nil {
		t.Fatal(err)
	}
	schedule := p.store.Schedules().Doc("s1")
	if _, err := schedule.Set(ctx, map[string]any{"next_fire_at": time.Now().Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	rerun := p.store.Reruns().Doc("r1")
	stepIdle := func(what string) {
		t.Helper()
		for range 3 * int(p.cfg.IdleAfter/p.cfg.Interval) {
			if err := c.Step(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(p.cfg.Interval)
		}
		if got := p.fake.Instances(); got != 1 {
			t.Fatalf("%s: pool at %d after three idle periods, want 1", what, got)
		}
	}
	stepIdle("a schedule with a next fire")
	if _, err := rerun.Set(ctx, map[string]any{"state": "running"}); err != nil {
		t.Fatal(err)
	}
	if _, err := schedule.Set(ctx, map[string]any{"paused": true}); err != nil { // a paused schedule has no next_fire_at
		t.Fatal(err)
	}
	stepIdle("a running re-run")
	if _, err := rerun.Set(ctx, map[string]any{"state": "completed"}); err != nil {
		t.Fatal(err)
	}
	until(t, c, p, "asleep with the schedule paused and the re-run completed", func() bool { return p.fake.Instances() == 0 })
}
