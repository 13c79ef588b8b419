package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// peak counts the fake's generations in flight per tenant, as the fake holds them: from the
// latency's draw until it has passed.
type peak struct {
	mu       sync.Mutex
	now, max map[string]int
}

func newPeak() *peak { return &peak{now: map[string]int{}, max: map[string]int{}} }

// latency holds every call d and counts it under the tenant its prompt names ("tenant-x ...").
func (p *peak) latency(d time.Duration) geminitest.Latency {
	return geminitest.Latency{Func: func(r geminitest.Request) time.Duration {
		tenant, _, _ := strings.Cut(strings.TrimPrefix(r.Prompt, "summarize "), "/")
		p.mu.Lock()
		p.now[tenant]++
		p.max[tenant] = max(p.max[tenant], p.now[tenant])
		p.mu.Unlock()
		time.AfterFunc(d, func() {
			p.mu.Lock()
			p.now[tenant]--
			p.mu.Unlock()
		})
		return d
	}}
}

func (p *peak) of(tenant string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max[tenant]
}

// instance is one worker instance of a test: its handler, consuming (Local runs) until the test
// ends.
func (b *bundle) instance(t *testing.T, owner string, waitMax time.Duration) *Handler {
	t.Helper()
	h := b.handler(policy(owner), chain("m"), WithModelPolicy(b.modelPolicy(quota.BudgetWait)), WithCapacity(8, 4, 32), WithTenantSlots(waitMax))
	consume(t, h)
	return h
}

// consume makes h consume (its Local runs) until the test ends.
func consume(t *testing.T, h *Handler) {
	t.Helper()
	l := NewLocal(h)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, "the instance to consume", 10*time.Second, l.consuming)
}

// slotEvents returns how many times h counted event (obs.Slot*) in genbox.tenant.slots.
func (b *bundle) slotEvents(t *testing.T, h *Handler, event string) int {
	t.Helper()
	return b.count(t, h, obs.MetricTenantSlots, obs.AttrEvent+"="+event)
}

func tenantMsg(id, tenant string) *bus.Message {
	return &bus.Message{ID: "m-" + id, Attributes: map[string]string{task.AttrTaskID: id, task.AttrTenant: tenant}}
}

// capTask writes a queued task of tenant whose prompt names its tenant (peak counts it).
func (b *bundle) capTask(t *testing.T, tenant, id string, mutate ...func(*protocol.Task)) {
	t.Helper()
	b.task(t, id, append([]func(*protocol.Task){func(d *protocol.Task) {
		d.Tenant, d.Input, d.Priority = tenant, "summarize "+tenant+"/"+id, task.DefaultPriority
	}}, mutate...)...)
}

func (b *bundle) waitSucceeded(t *testing.T, ids ...string) {
	t.Helper()
	waitFor(t, "every task to succeed", time.Minute, func() bool {
		for _, id := range ids {
			if b.get(t, id).State != task.StateSucceeded {
				return false
			}
		}
		return true
	})
}

// A tenant's cap holds across two instances: its backlog, nudged at both at once, never has more
// calls at the fake than the cap; the tasks over it wait (marked once, never claimed before their
// turn), each is started by the hand-off of a task ending and billed once, and the count ends
// at zero. Another tenant's task is not held up behind the backlog.
func TestTenantCapAcrossInstances(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	p := newPeak()
	b.srv.SetLatency("", p.latency(50*time.Millisecond))
	const limit, n = 3, 24
	b.tenant(t, "tenant-a", store.Limits{Concurrency: limit})
	hs := []*Handler{b.instance(t, "w1", time.Hour), b.instance(t, "w2", time.Hour)}
	var ids []string
	for i := range n {
		id := fmt.Sprintf("a-%02d", i)
		b.capTask(t, "tenant-a", id)
		ids = append(ids, id)
	}
	b.capTask(t, "tenant-b", "b-0")
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { hs[i%2].Handle(ctx, tenantMsg(id, "tenant-a")) })
	}
	wg.Wait()
	hs[0].Handle(ctx, tenantMsg("b-0", "tenant-b"))
	if got := b.get(t, "b-0"); got.State != task.StateSucceeded {
		t.Errorf("tenant B's task is %s behind A's backlog, want succeeded", got.State)
	}
	b.waitSucceeded(t, ids...)

	if got := p.of("tenant-a"); got > limit {
		t.Errorf("tenant A had %d calls at once, want at most its cap %d", got, limit)
	}
	led := b.srv.Ledger()
	for _, id := range ids {
		if bills := len(led.BillsFor("/" + id)); bills > 1 {
			t.Errorf("%s billed %d times", id, bills)
		}
	}
	if got := led.Total.Calls; got != n+1 {
		t.Errorf("%d model calls, want %d: one per task", got, n+1)
	}
	var waiting, handed int
	for _, h := range hs {
		waiting += b.slotEvents(t, h, obs.SlotWaiting)
		handed += b.slotEvents(t, h, obs.SlotHandedOff)
	}
	if waiting > n-limit+limit || handed == 0 {
		t.Errorf("%d marks waiting, %d hand-offs; want each task marked at most once and slots handed on", waiting, handed)
	}
	c, err := b.store.GetSlotCount(ctx, "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	if c.Running != 0 {
		t.Errorf("slot count %d after every task ended, want 0", c.Running)
	}
}

// A slot goes to the waiting task of the highest priority, then the oldest: with a cap of 1 and
// the slot held, tasks marked waiting in the order low, high, low, higher run higher, high,
// then the two lows oldest first.
func TestSlotHandedByPriority(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{Concurrency: 1})
	h := b.instance(t, "w1", time.Hour)
	ctx := context.Background()
	gate := b.srv.Block("m")
	b.capTask(t, "tenant-a", "holder")
	go h.Handle(ctx, tenantMsg("holder", "tenant-a"))
	<-gate.Entered()
	order := []struct {
		id       string
		priority int
	}{{"low-1", 2}, {"high", 7}, {"low-2", 2}, {"higher", 9}}
	for _, o := range order {
		b.capTask(t, "tenant-a", o.id, func(d *protocol.Task) { d.Priority = o.priority })
		h.Handle(ctx, tenantMsg(o.id, "tenant-a"))
		if got := b.get(t, o.id); !got.AwaitsSlot || got.State != task.StateQueued || got.Lease.Owner != "" {
			t.Fatalf("%s: state %s awaits_slot %v lease %+v; want waiting unclaimed", o.id, got.State, got.AwaitsSlot, got.Lease)
		}
	}
	var entered []string
	for range order {
		gate.Release()
		gate = b.srv.Block("m")
		r := <-gate.Entered()
		_, id, _ := strings.Cut(r.Prompt, "/")
		entered = append(entered, id)
	}
	gate.Release()
	want := []string{"higher", "high", "low-1", "low-2"}
	if strings.Join(entered, ",") != strings.Join(want, ",") {
		t.Errorf("slot handed in the order %v, want %v", entered, want)
	}
	b.waitSucceeded(t, "holder", "low-1", "high", "low-2", "higher")
}

// A task marked waiting while its tenant's slot is in fact free (the count read as full a
// moment before) is admitted by the recheck that follows the mark, not left to its not_before.
func TestWaitingTaskAdmittedWhenASlotIsFree(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{Concurrency: 1})
	h := b.instance(t, "w1", time.Hour)
	b.capTask(t, "tenant-a", "a")
	h.slots.seenFull("tenant-a")
	h.Handle(context.Background(), tenantMsg("a", "tenant-a"))
	if n := b.slotEvents(t, h, obs.SlotWaiting); n != 1 {
		t.Fatalf("%d tasks marked waiting, want the one", n)
	}
	b.waitSucceeded(t, "a")
}

// The safety net: a waiting task whose not_before has passed is claimed by the next nudge (the
// sweeper's) when a slot is free, and marked waiting again, once, when none is.
func TestWaitingTaskPastItsWait(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{Concurrency: 1})
	h := b.instance(t, "w1", 50*time.Millisecond)
	ctx := context.Background()
	gate := b.srv.Block("m")
	defer gate.Release()
	b.capTask(t, "tenant-a", "holder")
	go h.Handle(ctx, tenantMsg("holder", "tenant-a"))
	<-gate.Entered()
	b.capTask(t, "tenant-a", "a")
	h.Handle(ctx, msg("a"))
	first := b.get(t, "a")
	waitFor(t, "the wait to pass", 10*time.Second, func() bool { return time.Now().After(*first.NotBefore) })
	h.Handle(ctx, msg("a"))
	again := b.get(t, "a")
	if !again.AwaitsSlot || !again.NotBefore.After(*first.NotBefore) {
		t.Fatalf("re-nudged with the slot held: awaits_slot %v not_before %v (was %v); want waiting again, later", again.AwaitsSlot, again.NotBefore, first.NotBefore)
	}
	gate.Release()
	b.waitSucceeded(t, "holder", "a")
}

// Tasks re-queued right after a backlog drained — a re-run's new replays — start at once: the
// slots are free and nothing else will hand them one before their not_before. Before the fix
// this instance still took them for handed a slot (its pops of their earlier version) and left
// them waiting (the re-run's stall that reverted ca1e842).
func TestTasksRequeuedAfterABacklogDrainedStart(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	const limit, n = 3, 12
	b.tenant(t, "tenant-a", store.Limits{Concurrency: limit})
	h := b.instance(t, "w1", time.Hour)
	ctx := context.Background()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("a-%02d", i)
		b.capTask(t, "tenant-a", id)
		ids = append(ids, id)
	}
	handle := func() {
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() { h.Handle(ctx, tenantMsg(id, "tenant-a")) })
		}
		wg.Wait()
		b.waitSucceeded(t, ids...)
	}
	handle()
	for _, id := range ids {
		if _, err := b.store.MutateTask(ctx, id, func(t *protocol.Task, _ time.Time) error {
			t.Regenerate()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	handle()
}

// A task handed a slot is claimed in the commit of the task it follows, then waits for room in
// this instance behind the messages already in hand: its lease is renewed meanwhile. Before, it
// lapsed there under load, and the sweeper's takeover generated the task a second time
// (TestRerunOf500... billed a task three times).
func TestTaskHandedASlotKeepsItsLeaseWhileItWaitsForRoom(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{Concurrency: 1})
	pol := policy("w1")
	pol.LeaseTTL = 500 * time.Millisecond
	h := b.handler(pol, chain("m"), WithModelPolicy(b.modelPolicy(quota.BudgetWait)), WithCapacity(2, 0, 2), WithTenantSlots(time.Hour))
	consume(t, h)
	ctx := context.Background()
	gateA, gateB := b.srv.Block("m"), b.srv.Block("m2")
	defer gateA.Release()
	defer gateB.Release()
	b.capTask(t, "tenant-a", "holder")
	go h.Handle(ctx, tenantMsg("holder", "tenant-a"))
	<-gateA.Entered()
	b.capTask(t, "tenant-a", "handed")
	h.Handle(ctx, tenantMsg("handed", "tenant-a"))
	// Tenant B's two tasks fill the room: one calling, one in hand waiting for a place, ahead of
	// the task the holder will hand its slot to.
	other := func(d *protocol.Task) { d.ModelChain = []string{"m2"} }
	b.capTask(t, "tenant-b", "b-1", other)
	b.capTask(t, "tenant-b", "b-2", other)
	go h.Handle(ctx, tenantMsg("b-1", "tenant-b"))
	<-gateB.Entered()
	go h.Handle(ctx, tenantMsg("b-2", "tenant-b"))
	waitFor(t, "b-2 to wait for room", 10*time.Second, func() bool { return h.inHand.Holds("b-2") })
	gateA.Release()
	waitFor(t, "the slot to be handed", 10*time.Second, func() bool { return b.get(t, "handed").State == task.StateRunning })
	first := b.get(t, "handed")
	waitFor(t, "three lease lengths to pass", 10*time.Second, func() bool { return time.Since(*first.Lease.ExpiresAt) > 2*pol.LeaseTTL })
	if got := b.get(t, "handed"); got.State != task.StateRunning || !got.Lease.Live(time.Now()) {
		t.Fatalf("task handed a slot, waiting for room: state %s, lease %+v; want running with its lease renewed", got.State, got.Lease)
	}
	gateB.Release()
	b.waitSucceeded(t, "holder", "handed", "b-1", "b-2")
	if bills := len(b.srv.Ledger().BillsFor("/handed")); bills != 1 {
		t.Errorf("the handed task was billed %d times, want once", bills)
	}
}

// A task created waiting for a slot (the publisher found its tenant's slots taken, a moment
// before one freed) is not claimed by its nudge, nor rewritten: the nudge rechecks the count,
// and the free slot admits it.
func TestTaskCreatedWaitingIsAdmittedByItsNudge(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{Concurrency: 1})
	h := b.instance(t, "w1", time.Hour)
	b.capTask(t, "tenant-a", "a", func(d *protocol.Task) { d.AwaitSlot(time.Now().Add(time.Hour)) })
	h.Handle(context.Background(), tenantMsg("a", "tenant-a"))
	b.waitSucceeded(t, "a")
	if n := b.slotEvents(t, h, obs.SlotWaiting); n != 0 {
		t.Errorf("%d tasks marked waiting by the worker, want none: it was created so", n)
	}
}
