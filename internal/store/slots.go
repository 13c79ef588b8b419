package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	task  *Task // written whole, finalized, conditioned on its UpdateTime
	count *SlotCount
	delta int
}

// TaskWrite writes t, changed from the task as read at t.UpdateTime, in the same commit.
func TaskWrite(t *Task) Write { return Write{task: t} }

// CountWrite sets the tenant's slot count to c.Running + delta, conditioned on c as read (created
// when c.Read is zero).
func CountWrite(c SlotCount, delta int) Write { return Write{count: &c, delta: delta} }

// writeOther adds o to the write-only transaction tx.
func (s *Store) writeOther(tx *firestore.Transaction, o Write, now time.Time) error {
	if o.task != nil {
		t := o.task
		t.Nudges, t.NudgeAt = 0, nil
		t.UpdatedAt = now
		Finalize(t, now, s.Retention, s.Shards)
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

// AwaitingSlot returns at most n of tenant's tasks waiting for a slot, in the order they get one:
// highest priority first, then oldest first (store.Queries "awaiting-slot").
func (s *Store) AwaitingSlot(ctx context.Context, tenant string, n int) ([]*Task, error) {
	snaps, err := s.Tasks().Where("tenant", "==", tenant).Where("awaits_slot", "==", true).
		OrderBy("priority", firestore.Desc).OrderBy("created_at", firestore.Asc).Limit(n).Documents(ctx).GetAll()
	if err != nil {
		return nil, fmt.Errorf("tasks of %s awaiting a slot: %w", tenant, err)
	}
	out := make([]*Task, 0, len(snaps))
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
}

// Share is the part of its cap the tenant runs, between 0 and 1 (0 without a cap).
func (v TenantSlotsView) Share() float64 {
	if v.Cap <= 0 {
		return 0
	}
	return min(float64(v.Running)/float64(v.Cap), 1)
}

// TenantSlots lists every tenant that has had a slot count, by tenant id: its count, the tasks
// waiting for a slot (a count aggregation over the "awaiting-slot" index) and its cap. A read of
// the count, of the tenant and one aggregation per tenant.
func (s *Store) TenantSlots(ctx context.Context) ([]TenantSlotsView, error) {
	snaps, err := s.FS.Collection(SlotsCollection).OrderBy(firestore.DocumentID, firestore.Asc).Documents(ctx).GetAll()
	if err != nil {
		return nil, fmt.Errorf("tenant slots: %w", err)
	}
	out := make([]TenantSlotsView, 0, len(snaps))
	for _, snap := range snaps {
		var d Slots
		if err := snap.DataTo(&d); err != nil {
			return nil, fmt.Errorf("decode slot count of tenant %s: %w", snap.Ref.ID, err)
		}
		v := TenantSlotsView{Tenant: snap.Ref.ID, Running: int64(d.Running)}
		q := s.Tasks().Where("tenant", "==", v.Tenant).Where("awaits_slot", "==", true)
		res, err := q.NewAggregationQuery().WithCount("n").Get(ctx)
		if err != nil {
			return nil, fmt.Errorf("tasks of %s awaiting a slot: %w", v.Tenant, err)
		}
		v.Waiting = countOf(res["n"])
		switch t, err := s.GetTenant(ctx, v.Tenant); {
		case err == nil:
			v.Cap = t.Limits.Concurrency
		case !errors.Is(err, ErrNotFound):
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
