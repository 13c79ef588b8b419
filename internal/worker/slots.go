package worker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Tenant slots (docs/architecture.md §4 step 1, store/slots.go). A tenant's concurrency cap
// holds across instances through its slot count, tenant_slots/{tenant}, written only in the
// commits that change a task's Slot:
//
//   - the claim of a task of a capped tenant takes a slot (count + 1) when the count is below
//     the cap, or marks the task waiting for one (AwaitsSlot, not_before GENBOX_TENANT_WAIT_MAX
//     ahead: the sweeper's safety net) — no claim, no hand-back, no later rewrite;
//   - the write that ends a slot holder's run hands its slot to the tenant's next waiting task —
//     highest priority, then oldest — claimed for this instance in the same commit and run here
//     (Local), or, when none waits, frees it (count − 1).
//
// A backlog therefore costs each task nothing to start — its claim rides on the commit of the
// task it follows — and nothing to wait when the publisher created it waiting
// (store.SlotHints), else one write, the mark.

// slotsHintTTL is how long a count this instance saw full (read, or kept full by a hand-off) is
// taken as still full without reading it: the claims of a backlog's tasks mark them waiting
// without a read each. A slot freed meanwhile is not missed: marking a task waiting schedules a
// read of the count (recheck) that admits waiting tasks into free slots.
const slotsHintTTL = time.Second

// recheckDelay gathers the rechecks of the tasks marked waiting together into one read.
const recheckDelay = 500 * time.Millisecond

// poolAge is how often an instance merges the waiting tasks other instances marked into its
// pool while its own last: a task marked elsewhere, whose own instance holds no slot, waits at
// most about that long for its turn here. Each merge makes the instances pop the same tasks for
// a while (one of them commits, the others read and move on), hence not more often.
const poolAge = 5 * time.Second

// takenFor is how long a task popped from a pool is left out of the pools refilled after: longer
// than a hand-off's commit takes.
const takenFor = 5 * time.Second

// slots is this instance's view of its tenants' slots. Safe for concurrent use.
type slots struct {
	waitMax time.Duration // GENBOX_TENANT_WAIT_MAX

	mu      sync.Mutex
	tenants map[string]*tenantSlots
}

// popped is a waiting task's version (its update time) popped from a pool, and when.
type popped struct {
	version, at time.Time
}

type tenantSlots struct {
	admit  sync.Mutex // one admission (a read of the count and its write) at a time here
	refill sync.Mutex // one query of the waiting tasks at a time here

	// Guarded by slots.mu.
	full   time.Time        // when the count was last seen at the cap
	pool   []*protocol.Task // waiting tasks to hand slots to, in their turn (nextWaiting)
	pooled time.Time        // when a query was last merged into it
	// taken are the tasks popped from the pool lately, by id: a query made before their
	// hand-off commits still finds that version of them waiting, and it is not handed a second
	// slot. A later version — the task queued again, a re-run's new replay — is another wait.
	taken      map[string]popped
	held       int // slots held by tasks this instance claimed
	rechecking bool
	again      bool // a recheck was asked for while one ran
}

func newSlots(waitMax time.Duration) *slots {
	return &slots{waitMax: waitMax, tenants: map[string]*tenantSlots{}}
}

func (s *slots) of(tenant string) *tenantSlots {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.tenants[tenant]
	if ts == nil {
		ts = &tenantSlots{taken: map[string]popped{}}
		s.tenants[tenant] = ts
	}
	return ts
}

// seenFull records that tenant's count is at its cap.
func (s *slots) seenFull(tenant string) {
	ts := s.of(tenant)
	s.mu.Lock()
	ts.full = time.Now()
	s.mu.Unlock()
}

// fullHint reports whether tenant's count was seen at its cap within slotsHintTTL.
func (s *slots) fullHint(tenant string) bool {
	ts := s.of(tenant)
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(ts.full) < slotsHintTTL
}

// hold changes the number of tenant's slots this instance's tasks hold by d.
func (s *slots) hold(tenant string, d int) {
	ts := s.of(tenant)
	s.mu.Lock()
	ts.held = max(ts.held+d, 0)
	s.mu.Unlock()
}

// nextWaiting pops the waiting task of tenant to hand a slot to: the first of its pool, highest
// priority then oldest. The pool holds the tasks this instance marked waiting, as it wrote them
// (handing one a slot costs no read), merged with what a query of the waiting tasks finds when
// the pool is empty or was last merged poolAge ago — as many as this instance holds slots, so
// that the tasks other instances marked are handed slots here too. It returns nil when none
// waits.
func (h *Handler) nextWaiting(ctx context.Context, tenant string) (*protocol.Task, error) {
	s := h.slots
	ts := s.of(tenant)
	if err := h.refillPool(ctx, tenant, ts); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ts.pool) == 0 {
		return nil, nil
	}
	t := ts.pool[0]
	ts.pool = ts.pool[1:]
	ts.taken[t.ID] = popped{version: t.UpdateTime, at: time.Now()}
	return t, nil
}

// refillPool merges a query of tenant's waiting tasks into its pool when the pool is empty or was
// last merged poolAge ago, one query at a time: the hand-offs that find it so together wait for
// the same query.
func (h *Handler) refillPool(ctx context.Context, tenant string, ts *tenantSlots) error {
	s := h.slots
	stale := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(ts.pool) == 0 || time.Since(ts.pooled) > poolAge
	}
	if !stale() {
		return nil
	}
	ts.refill.Lock()
	defer ts.refill.Unlock()
	if !stale() {
		return nil
	}
	s.mu.Lock()
	n := max(ts.held, 1)
	s.mu.Unlock()
	found, err := h.store.AwaitingSlot(ctx, tenant, n)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	maps.DeleteFunc(ts.taken, func(_ string, p popped) bool { return now.Sub(p.at) > takenFor })
	for _, t := range found {
		ts.add(t)
	}
	ts.pooled = now
	return nil
}

// add inserts t into the pool in its turn, unless this version of it was taken; a pooled
// version of it written earlier is replaced. The caller holds slots.mu.
func (ts *tenantSlots) add(t *protocol.Task) {
	if p, ok := ts.taken[t.ID]; ok && !t.UpdateTime.After(p.version) {
		return
	}
	if i := slices.IndexFunc(ts.pool, func(p *protocol.Task) bool { return p.ID == t.ID }); i >= 0 {
		if !t.UpdateTime.After(ts.pool[i].UpdateTime) {
			return
		}
		ts.pool = slices.Delete(ts.pool, i, i+1)
	}
	i, _ := slices.BinarySearchFunc(ts.pool, t, waitingOrder)
	ts.pool = slices.Insert(ts.pool, i, t)
}

// repool puts t, a waiting task handed a slot by a commit that failed, back in its tenant's pool
// as it is now, if it still waits: the commit may have failed for the other task it wrote, and t
// keeps its turn. A read, on this path only.
func (h *Handler) repool(ctx context.Context, t *protocol.Task) {
	s := h.slots
	ts := s.of(t.Tenant)
	s.mu.Lock()
	delete(ts.taken, t.ID)
	s.mu.Unlock()
	cur, err := h.store.GetTask(ctx, t.ID)
	if err != nil || !cur.AwaitsSlot {
		return
	}
	s.pooled(cur)
}

// waitingOrder is the order waiting tasks get slots in: highest priority, then oldest.
func waitingOrder(a, b *protocol.Task) int {
	if a.Priority != b.Priority {
		return b.Priority - a.Priority
	}
	return a.CreatedAt.Compare(b.CreatedAt)
}

// pooled adds t, just marked waiting here, to its tenant's pool.
func (s *slots) pooled(t *protocol.Task) {
	ts := s.of(t.Tenant)
	s.mu.Lock()
	defer s.mu.Unlock()
	ts.add(t.Clone())
}

// capOf is tenant's concurrency cap, or its share of the pool when lower (fairshare.go); 0: none.
func (h *Handler) capOf(ctx context.Context, tenant string) (int, error) {
	l, err := h.limits(ctx, tenant)
	if err != nil {
		return 0, err
	}
	return h.shares.shareCap(tenant, max(l.Concurrency, 0)), nil
}

// admitsTenant reports whether a claim of a task of tenant may take one of its slots: the tenant
// is capped and its count was not seen full lately. Such claims are made one at a time per
// tenant here (tenantSlots.admit): their writes of the count would otherwise all be conditioned
// on the same read, and all but one fail.
func (h *Handler) admitsTenant(ctx context.Context, tenant string) bool {
	if h.slots == nil {
		return false
	}
	c, err := h.capOf(ctx, tenant)
	return err == nil && c > 0 && !h.slots.fullHint(tenant)
}

// admit decides, inside a claim's write, whether t — about to be claimed fresh — takes one of
// its tenant's slots: it returns the count's write when it does (t.Slot set), or wait when the
// tenant is at its cap, or nothing when the tenant has no cap.
func (h *Handler) admit(ctx context.Context, t *protocol.Task) (w []store.Write, wait bool, err error) {
	if h.slots == nil {
		return nil, false, nil
	}
	limit, err := h.capOf(ctx, t.Tenant)
	if err != nil || limit == 0 {
		return nil, false, err
	}
	if h.slots.fullHint(t.Tenant) {
		return nil, true, nil
	}
	c, err := h.store.GetSlotCount(ctx, t.Tenant)
	if err != nil {
		return nil, false, err
	}
	if c.Running >= limit {
		h.slots.seenFull(t.Tenant)
		return nil, true, nil
	}
	if c.Running+1 >= limit {
		h.slots.seenFull(t.Tenant)
	}
	t.Slot = true
	return []store.Write{store.CountWrite(c, +1)}, false, nil
}

// awaitSlot marks t waiting for a slot of its tenant: queued, left alone until a hand-off claims
// it or its not_before (GENBOX_TENANT_WAIT_MAX) passes and the sweeper nudges it.
func (h *Handler) awaitSlot(t *protocol.Task, now time.Time) {
	t.AwaitSlot(now.Add(h.slots.waitMax))
}

// takeHandedSlot claims t, a task waiting for a slot, for this instance with the slot a task of
// its tenant gives up, and reports whether it could: not when it no longer waits or its
// run_before has passed (the sweeper fails it as expired).
func (h *Handler) takeHandedSlot(t *protocol.Task, now time.Time) bool {
	if t.State != task.StateQueued || !t.AwaitsSlot || t.HasOutput() || t.RunBefore != nil && !now.Before(*t.RunBefore) {
		return false
	}
	if err := t.Lease.Take(h.pol.Owner, now, h.pol.LeaseTTL); err != nil {
		return false
	}
	t.State, t.AwaitsSlot, t.NotBefore, t.Slot, t.Claims = task.StateRunning, false, nil, true, 0
	return true
}

// handoff is what the write that ended a slot holder's run did with the slot: next is the task
// claimed with it, to run here; freed, the slot went back to the count, and nudge names a
// waiting task this instance cannot run, to nudge.
type handoff struct {
	next  *protocol.Task
	freed bool
	nudge string
}

// passSlot is the worker's part of a slot holder's write: a task that holds a slot and no longer
// runs gives it up to its tenant's next waiting task, claimed for this instance in the same
// commit; when none waits, this instance takes no work or the tenant runs more than its share of
// the pool (fairshare.go), the store gives it back to the count in that commit
// (store.settleSlot), as for every other path that ends a run.
func (h *Handler) passSlot(ctx context.Context, t *protocol.Task, now time.Time, ho *handoff) ([]store.Write, error) {
	if !t.Slot || t.State == task.StateRunning {
		return nil, nil
	}
	t.Slot = false
	ho.freed = true // unless handed on below: the store frees it (store.settleSlot)
	if h.slots == nil {
		return nil, nil
	}
	limit, err := h.capOf(ctx, t.Tenant)
	if err != nil {
		return nil, err
	}
	if limit > 0 && h.shares.over(t.Tenant) {
		return nil, nil
	}
	for limit > 0 {
		next, err := h.nextWaiting(ctx, t.Tenant)
		if err != nil {
			return nil, err
		}
		if next == nil {
			break
		}
		if h.local == nil || !h.local.consuming() {
			ho.nudge = next.ID
			break
		}
		c := next.Clone()
		if !h.takeHandedSlot(c, now) {
			continue
		}
		ho.next, ho.freed = c, false
		return []store.Write{store.TaskWrite(c)}, nil
	}
	return nil, nil
}

// mutate is every write of the worker that may end a run: fn changes the task, and a slot the
// task held passes on in the same commit (passSlot). The task a slot was handed to is run here
// once the commit succeeded.
func (h *Handler) mutate(ctx context.Context, known *protocol.Task, fn store.WithFunc) (*protocol.Task, error) {
	var ho handoff
	t, err := h.store.MutateTaskWith(ctx, known, func(t *protocol.Task, now time.Time) ([]store.Write, error) {
		if ho.next != nil {
			h.repool(ctx, ho.next)
		}
		ho = handoff{}
		w, err := fn(t, now)
		if err != nil {
			return nil, err
		}
		passed, err := h.passSlot(ctx, t, now, &ho)
		if err != nil {
			return nil, fmt.Errorf("pass the slot of %s: %w", t.ID, err)
		}
		return append(w, passed...), nil
	})
	if err != nil {
		if ho.next != nil {
			h.repool(ctx, ho.next)
		}
		return t, err
	}
	h.handedOff(ctx, t, ho)
	return t, nil
}

// handedOff acts on a committed hand-off: runs the task the slot went to, or nudges the waiting
// task this instance could not take.
func (h *Handler) handedOff(ctx context.Context, from *protocol.Task, ho handoff) {
	switch {
	case ho.next != nil:
		h.metrics.TenantSlot(ctx, from.Tenant, obs.SlotHandedOff)
		h.slots.seenFull(from.Tenant)
		if !h.local.adopt(ho.next) {
			log := h.log.With("task_id", ho.next.ID)
			log.InfoContext(ctx, "stopped taking work before running a task handed a slot; released")
			h.runOf(log, ho.next, nil).release(ctx)
		}
	case ho.freed && h.slots != nil:
		h.metrics.TenantSlot(ctx, from.Tenant, obs.SlotFreed)
		h.slots.hold(from.Tenant, -1)
		h.recheck(from.Tenant)
		if ho.nudge == "" {
			return
		}
		if _, err := h.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: ho.nudge, task.AttrTenant: from.Tenant}); err != nil {
			h.log.WarnContext(ctx, "nudge of a task waiting for a slot not published; the sweeper will", "task_id", ho.nudge, "error", err)
		}
	}
}

// recheck reads tenant's count a little after tasks were marked waiting, or a slot was freed,
// and admits waiting tasks into the slots it finds free: a slot freed while tasks were being
// marked (its holder found none waiting) is not left idle until their not_before. One recheck at
// a time per tenant; one asked for while it runs runs again after it.
func (h *Handler) recheck(tenant string) {
	s := h.slots
	ts := s.of(tenant)
	s.mu.Lock()
	if h.local == nil {
		s.mu.Unlock()
		return
	}
	if ts.rechecking {
		ts.again = true
		s.mu.Unlock()
		return
	}
	ts.rechecking = true
	s.mu.Unlock()
	go func() {
		for {
			time.Sleep(recheckDelay)
			ctx := context.Background()
			limit, err := h.capOf(ctx, tenant)
			for i := 0; err == nil && i < limit && h.local.consuming() && h.admitWaiting(ctx, tenant); i++ {
			}
			s.mu.Lock()
			if !ts.again {
				ts.rechecking = false
				s.mu.Unlock()
				return
			}
			ts.again = false
			s.mu.Unlock()
		}
	}()
}

// admitWaiting claims the next waiting task of tenant for this instance with a free slot, if the
// count has one, runs it here, and reports whether it did.
func (h *Handler) admitWaiting(ctx context.Context, tenant string) bool {
	ts := h.slots.of(tenant)
	ts.admit.Lock()
	defer ts.admit.Unlock()
	limit, err := h.capOf(ctx, tenant)
	if err != nil || limit == 0 {
		return false
	}
	c, err := h.store.GetSlotCount(ctx, tenant)
	if err != nil {
		h.log.WarnContext(ctx, "slot count unreadable; waiting tasks wait for a hand-off or their not_before", "tenant", tenant, "error", err)
		return false
	}
	if c.Running >= limit {
		h.slots.seenFull(tenant)
		return false
	}
	next, err := h.nextWaiting(ctx, tenant)
	if err != nil || next == nil {
		return false
	}
	var claimed *protocol.Task
	t, err := h.store.MutateTaskWith(ctx, next, func(t *protocol.Task, now time.Time) ([]store.Write, error) {
		claimed = nil
		if !h.takeHandedSlot(t, now) {
			return nil, store.ErrNoChange
		}
		c, err := h.store.GetSlotCount(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if c.Running >= limit {
			return nil, errSlotsFull
		}
		claimed = t
		return []store.Write{store.CountWrite(c, +1)}, nil
	})
	if err != nil || claimed == nil {
		h.repool(ctx, next)
		return err == nil // a task no longer waiting: try the next
	}
	h.slots.hold(tenant, +1)
	h.metrics.TenantSlot(ctx, tenant, obs.SlotTaken)
	if !h.local.adopt(t) {
		h.runOf(h.log.With("task_id", t.ID), t, nil).release(ctx)
		return false
	}
	return true
}

var errSlotsFull = fmt.Errorf("worker: every slot of the tenant is taken")
