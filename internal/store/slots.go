package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/task"
)

// SlotsCollection holds one document per capped tenant, tenant_slots/{tenant}: how many of its
// tasks hold one of its concurrency slots (Task.Slot), whatever worker instance runs them.
//
// The count changes only in the commit that changes a task's Slot, conditioned on the count as
// read, so it is exact: a claim that takes a slot adds one, and a write that ends a run either
// hands the slot to the tenant's next waiting task, claimed in the same commit (the count is not
// written), or, when none waits, subtracts one. A tenant's tasks therefore never run more than
// its cap at once across instances, and a backlog's tasks pass slots along without writing the
// count at all.
const SlotsCollection = "tenant_slots"

// Slots is the tenant_slots/{tenant} document.
type Slots struct {
	Running   int       `firestore:"running"`
	UpdatedAt time.Time `firestore:"updated_at"`
}

// SlotCount is a tenant's slot count as read: Read is the document's update time, zero when it
// does not exist yet.
type SlotCount struct {
	Tenant  string
	Running int
	Read    time.Time
}

// GetSlotCount reads tenant's slot count (zero when it has no document yet).
func (s *Store) GetSlotCount(ctx context.Context, tenant string) (SlotCount, error) {
	snap, err := s.FS.Collection(SlotsCollection).Doc(tenant).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return SlotCount{Tenant: tenant}, nil
	}
	if err != nil {
		return SlotCount{}, fmt.Errorf("slot count of tenant %s: %w", tenant, err)
	}
	var d Slots
	if err := snap.DataTo(&d); err != nil {
		return SlotCount{}, fmt.Errorf("decode slot count of tenant %s: %w", tenant, err)
	}
	return SlotCount{Tenant: tenant, Running: d.Running, Read: snap.UpdateTime}, nil
}

// Write is a document a task's read-modify-write commits with the task (MutateTaskWith),
// conditioned on its own read: another task claimed in the same commit (TaskWrite), or a
// tenant's slot count (CountWrite).
type Write struct {
	task  *protocol.Task // written whole, finalized, conditioned on its UpdateTime
	count *SlotCount
	delta int
}

// TaskWrite writes t, changed from the task as read at t.UpdateTime, in the same commit.
func TaskWrite(t *protocol.Task) Write { return Write{task: t} }

// CountWrite sets the tenant's slot count to c.Running + delta, conditioned on c as read (created
// when c.Read is zero).
func CountWrite(c SlotCount, delta int) Write { return Write{count: &c, delta: delta} }

// writeOther adds o to the write-only transaction tx.
func (s *Store) writeOther(tx *firestore.Transaction, o Write, now time.Time) error {
	if o.task != nil {
		t := o.task
		t.Nudges, t.NudgeAt = 0, nil
		t.UpdatedAt = now
		protocol.Finalize(t, now, s.Retention, s.Shards)
		return tx.Update(s.Tasks().Doc(t.ID), documentUpdates(t), firestore.LastUpdateTime(t.UpdateTime))
	}
	c := o.count
	ref := s.FS.Collection(SlotsCollection).Doc(c.Tenant)
	d := Slots{Running: max(c.Running+o.delta, 0), UpdatedAt: now}
	if c.Read.IsZero() {
		return tx.Create(ref, d)
	}
	return tx.Update(ref, []firestore.Update{{Path: "running", Value: d.Running}, {Path: "updated_at", Value: now}},
		firestore.LastUpdateTime(c.Read))
}

// SlotHintTTL is how often SlotHints reads a tenant's slots again: a burst's submissions read
// the tenant and its count once a second per instance, and none of them waits for the read.
const SlotHintTTL = time.Second

// SlotHints tells whether a task submitted now will find its tenant's concurrency slots all
// taken, so that it is created waiting for one (Task.AwaitSlot) rather than marked so by the
// worker's claim: a backlog's task costs one write fewer. The slots are taken by the tasks the
// count holds, as last read, and by the tasks this instance has created queued since that read
// began, which the read could not count and whose claims will each take a slot: so the first
// cap tasks of a burst are created queued and the rest waiting, whether or not the worker has
// claimed the first ones yet. Only a tenant's first submission in an instance waits for its
// read, as for the tenant's limits (a cold path); after it a read older than SlotHintTTL is
// made again in the background and the hint answers as it was, so it may be a little more than
// a second old. A task created waiting with a slot free (a task created queued that took none,
// one that ended since) is admitted by the worker that takes its nudge (its claim finds it
// waiting and rechecks the count), or by the next hand-off. Safe for concurrent use.
type SlotHints struct {
	st *Store

	mu  sync.Mutex
	per map[string]*slotHint
}

type slotHint struct {
	limit, running int // the tenant's cap (0: none, or unreadable) and its count, as last read
	// queued counts the tasks created queued here since the last read began: each takes a
	// slot when claimed, which the read did not count.
	queued     int
	read       time.Time
	refreshing bool
}

// NewSlotHints returns the hints of s's tenants.
func NewSlotHints(s *Store) *SlotHints {
	return &SlotHints{st: s, per: map[string]*slotHint{}}
}

// hint returns tenant's hint: read now the first time, then again in the background once the
// last read is SlotHintTTL old. The caller holds no lock.
func (h *SlotHints) hint(ctx context.Context, tenant string, now time.Time) *slotHint {
	h.mu.Lock()
	hint := h.per[tenant]
	h.mu.Unlock()
	if hint == nil {
		first := &slotHint{read: now}
		first.limit, first.running = h.read(ctx, tenant)
		h.mu.Lock()
		if hint = h.per[tenant]; hint == nil {
			hint = first
			h.per[tenant] = hint
		}
		h.mu.Unlock()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !hint.refreshing && now.Sub(hint.read) >= SlotHintTTL {
		hint.refreshing = true
		before := hint.queued
		go func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			limit, running := h.read(rctx, tenant)
			h.mu.Lock()
			hint.limit, hint.running, hint.read, hint.refreshing = limit, running, now, false
			hint.queued -= before
			h.mu.Unlock()
		}()
	}
	return hint
}

// read returns tenant's cap and its slot count. What cannot be read has no cap: the worker's
// claim decides as it would without the hint.
func (h *SlotHints) read(ctx context.Context, tenant string) (limit, running int) {
	limits := DefaultLimits()
	switch t, err := h.st.GetTenant(ctx, tenant); {
	case err == nil:
		limits = t.Limits
	case !errors.Is(err, ErrNotFound):
		return 0, 0
	}
	if limits.Concurrency <= 0 {
		return 0, 0
	}
	c, err := h.st.GetSlotCount(ctx, tenant)
	if err != nil {
		return 0, 0
	}
	return limits.Concurrency, c.Running
}

// SubmitWaiting creates t, about to be submitted, waiting for a slot until waitMax from now
// when its tenant's slots will all be taken when it is claimed (SlotHints), unless it is of a
// priority above the default: such a task is to go ahead of the waiting ones, and the worker's
// claim marks it and pools it in its turn, to be handed the next slot. It reports whether t
// waits; a task of a capped tenant created queued counts among the slots taken.
func (h *SlotHints) SubmitWaiting(ctx context.Context, t *protocol.Task, waitMax time.Duration, now time.Time) bool {
	if t.State != task.StateQueued {
		return false
	}
	hint := h.hint(ctx, t.Tenant, now)
	h.mu.Lock()
	defer h.mu.Unlock()
	if hint.limit <= 0 {
		return false
	}
	if t.Priority > task.DefaultPriority || hint.running+hint.queued < hint.limit {
		hint.queued++
		return false
	}
	t.AwaitSlot(now.Add(waitMax))
	return true
}

// settleSlot is the slot rule of every task write (applyTask), wherever it is made — the
// worker's outcomes, a cancel, a decision, an erase, a batch job: a task waits for a slot only
// while queued and holds one only while running. A task read holding a slot that no longer runs
// gives it up, either handed to another task of its tenant claimed in the same commit (a
// TaskWrite of a task that holds a slot: the worker's hand-off), or freed: settleSlot reports
// true and the commit also takes one from the tenant's count (freeSlot, freeSlotsTx). So no
// path that ends a run can leave its slot taken, nor a finished task among the waiting ones.
func settleSlot(read, t *protocol.Task, with []Write) (freed bool) {
	if t.State != task.StateQueued {
		t.AwaitsSlot = false
	}
	if t.State == task.StateRunning {
		return false
	}
	t.Slot = false
	if !read.Slot {
		return false
	}
	for _, o := range with {
		if o.task != nil && o.task.Slot && o.task.Tenant == t.Tenant {
			return false
		}
	}
	return true
}

// freeSlot adds to w the count's write of the slot t freed, if it freed one: a read of the
// count, the write conditioned on it.
func (s *Store) freeSlot(ctx context.Context, t *protocol.Task, w *written) error {
	if !w.freed {
		return nil
	}
	c, err := s.GetSlotCount(ctx, t.Tenant)
	if err != nil {
		return err
	}
	w.with = append(w.with, CountWrite(c, -1))
	return nil
}

// freeSlotsTx takes the slots the tasks freed from their tenants' counts inside tx: it reads
// each count, so call it before tx writes anything.
func (s *Store) freeSlotsTx(tx *firestore.Transaction, freed []*protocol.Task, now time.Time) error {
	n := map[string]int{}
	for _, t := range freed {
		n[t.Tenant]++
	}
	tenants := slices.Sorted(maps.Keys(n))
	running := make([]int, len(tenants))
	for i, tenant := range tenants {
		snap, err := tx.Get(s.FS.Collection(SlotsCollection).Doc(tenant))
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			return fmt.Errorf("slot count of tenant %s: %w", tenant, err)
		}
		var d Slots
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode slot count of tenant %s: %w", tenant, err)
		}
		running[i] = d.Running
	}
	for i, tenant := range tenants {
		d := Slots{Running: max(running[i]-n[tenant], 0), UpdatedAt: now}
		if err := tx.Set(s.FS.Collection(SlotsCollection).Doc(tenant), d); err != nil {
			return err
		}
	}
	return nil
}

// AwaitingSlot returns at most n of tenant's tasks waiting for a slot, in the order they get one:
// highest priority first, then oldest first (store.Queries "awaiting-slot").
func (s *Store) AwaitingSlot(ctx context.Context, tenant string, n int) ([]*protocol.Task, error) {
	snaps, err := s.Tasks().Where("tenant", "==", tenant).Where("awaits_slot", "==", true).
		OrderBy("priority", firestore.Desc).OrderBy("created_at", firestore.Asc).Limit(n).Documents(ctx).GetAll()
	if err != nil {
		return nil, fmt.Errorf("tasks of %s awaiting a slot: %w", tenant, err)
	}
	out := make([]*protocol.Task, 0, len(snaps))
	for _, snap := range snaps {
		t, err := DecodeTask(snap)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// TenantSlotsView is a capped tenant's slots as the console shows them: its tasks running with
// a slot (the count), its tasks waiting for one, and its cap (0 when it has none any more).
type TenantSlotsView struct {
	Tenant           string
	Running, Waiting int64
	Cap              int
	// Weight is its part of the pool's slots when tenants contend for them (at least 1), and
	// InUse its part of the slots every tenant's tasks hold now, between 0 and 1: under
	// contention, InUse follows the tenants' weights (docs/capacity.md#fair-shares).
	Weight int
	InUse  float64
}

// Share is the part of its cap the tenant runs, between 0 and 1 (0 without a cap).
func (v TenantSlotsView) Share() float64 {
	if v.Cap <= 0 {
		return 0
	}
	return min(float64(v.Running)/float64(v.Cap), 1)
}

// TenantSlots lists every tenant that has had a slot count, by tenant id: its count, the tasks
// waiting for a slot (a count aggregation over the "awaiting-slot" index), its cap and weight,
// and its part of the slots held. A read of the count, of the tenant and one aggregation per
// tenant.
func (s *Store) TenantSlots(ctx context.Context) ([]TenantSlotsView, error) {
	counts, err := s.SlotCounts(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TenantSlotsView, 0, len(counts))
	var held int64
	for _, c := range counts {
		v := TenantSlotsView{Tenant: c.Tenant, Running: int64(c.Running), Weight: 1}
		if v.Waiting, err = s.CountAwaitingSlot(ctx, v.Tenant); err != nil {
			return nil, err
		}
		switch t, err := s.GetTenant(ctx, v.Tenant); {
		case err == nil:
			v.Cap, v.Weight = t.Limits.Concurrency, max(t.Limits.Weight, 1)
		case !errors.Is(err, ErrNotFound):
			return nil, err
		}
		out = append(out, v)
		held += v.Running
	}
	for i := range out {
		if held > 0 {
			out[i].InUse = float64(out[i].Running) / float64(held)
		}
	}
	return out, nil
}
