package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"cloud.google.com/go/firestore"
)

// SlotCounts reads every tenant's slot count (tenant_slots), by tenant id: a read per tenant
// that has had one.
func (s *Store) SlotCounts(ctx context.Context) ([]SlotCount, error) {
	return s.slotCounts(ctx, s.FS.Collection(SlotsCollection).Query)
}

// BusySlotCounts reads the slot counts of the tenants running tasks with a slot now, by tenant
// id: a read per such tenant (one when there is none), whatever the tenants that have been.
func (s *Store) BusySlotCounts(ctx context.Context) ([]SlotCount, error) {
	return s.slotCounts(ctx, s.FS.Collection(SlotsCollection).Where("running", ">", 0))
}

func (s *Store) slotCounts(ctx context.Context, q firestore.Query) ([]SlotCount, error) {
	snaps, err := q.Documents(ctx).GetAll()
	if err != nil {
		return nil, fmt.Errorf("tenant slots: %w", err)
	}
	out := make([]SlotCount, 0, len(snaps))
	for _, snap := range snaps {
		var d Slots
		if err := snap.DataTo(&d); err != nil {
			return nil, fmt.Errorf("decode slot count of tenant %s: %w", snap.Ref.ID, err)
		}
		out = append(out, SlotCount{Tenant: snap.Ref.ID, Running: d.Running, Read: snap.UpdateTime})
	}
	slices.SortFunc(out, func(a, b SlotCount) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

// CountAwaitingSlot counts tenant's tasks waiting for a slot: a count aggregation over the
// "awaiting-slot" index, billed a read per 1,000 tasks counted (at least one).
func (s *Store) CountAwaitingSlot(ctx context.Context, tenant string) (int64, error) {
	q := s.Tasks().Where("tenant", "==", tenant).Where("awaits_slot", "==", true)
	res, err := q.NewAggregationQuery().WithCount("n").Get(ctx)
	if err != nil {
		return 0, fmt.Errorf("tasks of %s awaiting a slot: %w", tenant, err)
	}
	return countOf(res["n"]), nil
}
