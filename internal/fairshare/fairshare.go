// Package fairshare owns the rule that divides the worker pool's model-call slots between
// tenants that together want more than the pool holds: each gets slots in proportion to its
// weight until it has what it asks (weighted max-min fairness, water-filling), and what a tenant
// does not ask is split among the others by weight. It is a pure function of the tenants' counts;
// the worker enforces what it returns as each tenant's concurrency cap (worker/fairshare.go).
package fairshare

import (
	"cmp"
	"math"
	"slices"
)

// Tenant is one tenant's claim on the pool.
type Tenant struct {
	ID string
	// Weight is its part of the pool among the tenants it contends with; 0 or less counts as 1.
	Weight int
	// Cap is its concurrency limit; 0 or less: none.
	Cap int
	// Running and Waiting are its tasks holding a slot and those waiting for one.
	Running, Waiting int
}

func (t Tenant) weight() float64 { return float64(max(t.Weight, 1)) }

// wants is what the tenant asks of the pool: its running and waiting tasks, up to its cap.
func (t Tenant) wants() int {
	w := t.Running + t.Waiting
	if t.Cap > 0 {
		w = min(w, t.Cap)
	}
	return w
}

// Allotment is what Allot gives a tenant.
type Allotment struct {
	// Slots is the cap the tenant is held to now: its own Cap when the pool is not contended;
	// under contention, for a tenant asking more than its share, that share (at least one slot),
	// and for one asking less, what it asks or its share of the whole pool if more (up to its
	// Cap), so that it may grow to that share at once.
	Slots int
	// Share is the slots the tenant is entitled to under contention: for a limited tenant, its
	// weighted part of what the others leave; for one asking less, its weighted part of the
	// whole pool. 0 when the pool is not contended.
	Share float64
	// Limited reports whether the tenant asks more than its share: it is held to it.
	Limited bool
}

// Allot divides pool slots among tenants, by ID. When what they ask together (running and
// waiting, up to their caps) fits in the pool, every tenant keeps its own cap. Otherwise the pool
// is water-filled: with a level L, a tenant asking at most Weight·L keeps what it asks, and every
// other tenant gets Weight·L, L chosen so that the pool is used whole; the limited tenants'
// shares are rounded to whole slots by largest remainder (ties by ID), so that they sum to what
// the others leave. A tenant asking less may still grow at once to its weighted part of the whole
// pool: the pool is then overshot by at most what those tenants do not use, until the next
// Allot sees them asking more.
func Allot(pool int, tenants []Tenant) map[string]Allotment {
	out := make(map[string]Allotment, len(tenants))
	asked := 0
	for _, t := range tenants {
		asked += t.wants()
	}
	if pool <= 0 || asked <= pool {
		for _, t := range tenants {
			out[t.ID] = Allotment{Slots: t.Cap}
		}
		return out
	}
	limited := slices.Clone(tenants)
	slices.SortFunc(limited, func(a, b Tenant) int { return cmp.Compare(a.ID, b.ID) })
	var satisfied []Tenant
	left := float64(pool)
	level := levelOf(left, limited)
	for {
		kept := limited[:0]
		n := len(satisfied)
		for _, t := range limited {
			if float64(t.wants()) <= t.weight()*level {
				satisfied = append(satisfied, t)
				left -= float64(t.wants())
			} else {
				kept = append(kept, t)
			}
		}
		limited = kept
		if len(satisfied) == n || len(limited) == 0 {
			break
		}
		level = levelOf(left, limited)
	}
	all := levelOf(float64(pool), tenants)
	for _, t := range satisfied {
		share := t.weight() * all
		slots := max(t.wants(), int(math.Ceil(share)), 1)
		if t.Cap > 0 {
			slots = min(slots, t.Cap)
		}
		out[t.ID] = Allotment{Slots: slots, Share: share}
	}
	// The limited tenants' shares, rounded down, then a slot more each by largest remainder
	// until what the satisfied ones leave is given.
	whole := make([]int, len(limited))
	order := make([]int, len(limited))
	given := 0
	for i, t := range limited {
		whole[i], order[i] = int(math.Floor(t.weight()*level)), i
		given += whole[i]
	}
	frac := func(i int) float64 { s := limited[i].weight() * level; return s - math.Floor(s) }
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(frac(b), frac(a)) })
	for _, i := range order[:min(max(int(math.Round(left))-given, 0), len(order))] {
		whole[i]++
	}
	for i, t := range limited {
		out[t.ID] = Allotment{Slots: max(whole[i], 1), Share: t.weight() * level, Limited: true}
	}
	return out
}

// levelOf is the level at which tenants, all limited, share left slots: left ÷ their weights.
func levelOf(left float64, tenants []Tenant) float64 {
	w := 0.0
	for _, t := range tenants {
		w += t.weight()
	}
	if w == 0 {
		return 0
	}
	return left / w
}
