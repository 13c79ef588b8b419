package publisher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/store"
)

// slotHintTTL is how long a tenant's slots read at a submission are taken as they were: a
// burst's submissions read the tenant and its count once a second per instance.
const slotHintTTL = time.Second

// slotHints tells whether a tenant's concurrency slots are all taken (store.SlotCount), so that
// a task submitted then is created waiting for one (store.Task.AwaitSlot) rather than marked so
// by the worker's claim: a backlog's task costs one write fewer. The hint may be a second old;
// a task created waiting with a slot free is admitted by the worker that takes its nudge (its
// claim finds it waiting and rechecks the count), or by the next hand-off. Safe for concurrent
// use.
type slotHints struct {
	st *store.Store

	mu  sync.Mutex
	per map[string]slotHint
}

type slotHint struct {
	full bool
	read time.Time
}

func newSlotHints(st *store.Store) *slotHints {
	return &slotHints{st: st, per: map[string]slotHint{}}
}

// full reports whether tenant's slots were all taken within slotHintTTL. What cannot be read
// is not full: the worker's claim decides as it would without the hint.
func (h *slotHints) full(ctx context.Context, tenant string, now time.Time) bool {
	h.mu.Lock()
	hint, ok := h.per[tenant]
	h.mu.Unlock()
	if ok && now.Sub(hint.read) < slotHintTTL {
		return hint.full
	}
	hint = slotHint{full: h.read(ctx, tenant), read: now}
	h.mu.Lock()
	h.per[tenant] = hint
	h.mu.Unlock()
	return hint.full
}

func (h *slotHints) read(ctx context.Context, tenant string) bool {
	limits := store.DefaultLimits()
	switch t, err := h.st.GetTenant(ctx, tenant); {
	case err == nil:
		limits = t.Limits
	case !errors.Is(err, store.ErrNotFound):
		return false
	}
	if limits.Concurrency <= 0 {
		return false
	}
	c, err := h.st.GetSlotCount(ctx, tenant)
	return err == nil && c.Running >= limits.Concurrency
}
