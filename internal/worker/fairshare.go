package worker

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/fairshare"
	"github.com/genbox-dev/genbox/internal/store"
)

// Fair shares (docs/capacity.md#fair-shares). When the capped tenants together want more slots
// than the worker pool holds — its instances × GENBOX_CONCURRENCY —, each is held to a cap of its
// weighted share of the pool (fairshare.Allot) rather than its own concurrency, and the slot
// machinery of slots.go enforces it: a claim over it waits, a hand-off of a tenant over it frees
// the slot instead, and a tenant whose cap rose has its waiting tasks admitted at once (recheck).
// Every instance divides the pool itself each shareEvery from the counts of the tenants running
// tasks (store.BusySlotCounts), counting a tenant's waiting tasks only when the pool may be
// contended.

// shareEvery is how often an instance reads the busy tenants' counts and divides the pool again:
// how soon a tenant whose backlog ended leaves its slots to the others, and a tenant that joins a
// contended pool is held to its share.
const shareEvery = time.Second

// shares is this instance's division of the pool. Safe for concurrent use.
type shares struct {
	mu            sync.Mutex
	instanceShare float64                        // this instance's part of the pool: 1 / instances
	allot         map[string]fairshare.Allotment // by tenant, as last divided
	running       map[string]int                 // the counts as read, less the slots freed here since for being over the share
}

// WithFairShares divides the pool's slots between contending tenants by weight; instanceShare
// is this instance's part of the pool (GENBOX_INSTANCE_SHARE: 1 / the instance count), until
// SetInstanceShare changes it (outside (0, 1]: 1). It needs WithCapacity and WithTenantSlots,
// and RunFairShares.
func WithFairShares(instanceShare float64) Option {
	return func(h *Handler) {
		h.shares = &shares{instanceShare: 1, allot: map[string]fairshare.Allotment{}, running: map[string]int{}}
		h.SetInstanceShare(instanceShare)
	}
}

// SetInstanceShare makes share this instance's part of the pool from now on: the autoscaler
// changes it as the pool's instance count changes. A share outside (0, 1] is ignored.
func (h *Handler) SetInstanceShare(share float64) {
	if h.shares == nil || !(share > 0 && share <= 1) {
		return
	}
	h.shares.mu.Lock()
	h.shares.instanceShare = share
	h.shares.mu.Unlock()
}

// pool is the deployment's model-call slots as this instance knows them: its own ÷ its share.
func (h *Handler) pool() int {
	if h.room == nil {
		return 0
	}
	h.shares.mu.Lock()
	defer h.shares.mu.Unlock()
	return int(math.Round(float64(cap(h.room.calls)) / h.shares.instanceShare))
}

// RunFairShares divides the pool every shareEvery until ctx ends.
func (h *Handler) RunFairShares(ctx context.Context) {
	if h.shares == nil || h.slots == nil || h.room == nil {
		return
	}
	tick := time.NewTicker(shareEvery)
	defer tick.Stop()
	for {
		if err := h.divide(ctx); err != nil && ctx.Err() == nil {
			h.log.WarnContext(ctx, "tenants' shares of the pool not divided; the last division holds", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// divide reads the busy tenants' counts, divides the pool between them, and rechecks each
// tenant whose cap rose or that has tasks waiting below it, so that they start without waiting
// for one of the tenant's runs to end. A tenant's waiting tasks are counted when the busy
// tenants fill the pool, when it was held to its share, or when it was divided before and runs
// nothing now (it stays in the division while it has tasks waiting: nothing else would admit
// them); otherwise the pool has room, and every tenant keeps its own cap.
func (h *Handler) divide(ctx context.Context) error {
	counts, err := h.store.BusySlotCounts(ctx)
	if err != nil {
		return err
	}
	pool, total := h.pool(), 0
	busy := map[string]bool{}
	for _, c := range counts {
		total += c.Running
		busy[c.Tenant] = true
	}
	s := h.shares
	s.mu.Lock()
	prev := s.allot
	s.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(prev)) {
		if !busy[id] {
			counts = append(counts, store.SlotCount{Tenant: id})
		}
	}
	var tenants []fairshare.Tenant
	for _, c := range counts {
		l, err := h.limits(ctx, c.Tenant)
		if err != nil {
			return err
		}
		if l.Concurrency <= 0 {
			continue
		}
		t := fairshare.Tenant{ID: c.Tenant, Weight: l.Weight, Cap: l.Concurrency, Running: c.Running}
		if total >= pool || prev[c.Tenant].Limited || !busy[c.Tenant] {
			n, err := h.store.CountAwaitingSlot(ctx, c.Tenant)
			if err != nil {
				return err
			}
			t.Waiting = int(n)
		}
		if !busy[c.Tenant] && t.Waiting == 0 {
			continue
		}
		tenants = append(tenants, t)
	}
	allot := fairshare.Allot(pool, tenants)
	running := make(map[string]int, len(tenants))
	for _, t := range tenants {
		running[t.ID] = t.Running
	}
	s.mu.Lock()
	s.allot, s.running = allot, running
	s.mu.Unlock()
	for _, t := range tenants {
		a := allot[t.ID]
		h.metrics.TenantShare(ctx, t.ID, t.Running, a.Slots, a.Share)
		was, ok := prev[t.ID]
		if ok && a.Slots > was.Slots || t.Waiting > 0 && t.Running < a.Slots {
			h.recheck(t.ID)
		}
	}
	return nil
}

// shareCap is the cap tenant is held to: its own concurrency limit, or its share of the pool
// when that is lower (a tenant the last division did not see keeps its own).
func (s *shares) shareCap(tenant string, limit int) int {
	if s == nil || limit <= 0 {
		return limit
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.allot[tenant]; ok && a.Slots > 0 {
		return min(limit, a.Slots)
	}
	return limit
}

// over reports whether tenant runs more tasks than its share as last read, counting the slots
// freed here since: a slot of a tenant over its share is freed, not handed to its next waiting
// task, and counted so that this instance frees only the excess it saw.
func (s *shares) over(tenant string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.allot[tenant]
	if !ok || a.Slots <= 0 || s.running[tenant] <= a.Slots {
		return false
	}
	s.running[tenant]--
	return true
}
