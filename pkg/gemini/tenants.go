package gemini

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// BudgetPolicy is what happens to a task whose tenant has spent its daily budget.
type BudgetPolicy string

// Budget policies.
const (
	// BudgetWait parks the task until the budget resets (the next UTC day).
	BudgetWait BudgetPolicy = "wait"
	// BudgetFail fails the task with kind budget.
	BudgetFail BudgetPolicy = "fail"
)

// ParseBudgetPolicy reads a policy name; "" is BudgetWait, the soft default.
func ParseBudgetPolicy(s string) (BudgetPolicy, error) {
	switch p := BudgetPolicy(s); p {
	case "":
		return BudgetWait, nil
	case BudgetWait, BudgetFail:
		return p, nil
	}
	return "", fmt.Errorf("budget policy %q: want %q or %q", s, BudgetWait, BudgetFail)
}

// ErrBudgetExhausted means a tenant's daily budget has no room for the estimate; no call was made.
var ErrBudgetExhausted = errors.New("gemini: tenant daily budget exhausted")

// SpendStore keeps each tenant's daily spend in sharded counters, so that no single document
// serializes every task.
type SpendStore interface {
	AddSpend(ctx context.Context, tenant, day string, usd float64) error
	Spent(ctx context.Context, tenant, day string) (float64, error)
}

// Budgets enforces per-tenant daily budgets as a soft limit: each instance reserves estimates in
// memory against the total it last read from the store, and flushes what it spent in batches.
// Instances may overshoot together by what they reserve between refreshes. Safe for concurrent use.
type Budgets struct {
	store   SpendStore
	now     func() time.Time
	refresh time.Duration

	mu      sync.Mutex
	tenants map[string]*tenantDay // tenant + "/" + day
}

type tenantDay struct {
	tenant, day string
	known       float64   // the store's total at the last refresh, plus what this instance flushed since
	readAt      time.Time // when known was read
	reserved    float64   // estimates of calls under way
	unflushed   float64   // spent here, not yet in the store
}

// NewBudgets returns Budgets over store that re-reads a tenant's total at most every refresh.
func NewBudgets(store SpendStore, now func() time.Time, refresh time.Duration) *Budgets {
	return &Budgets{store: store, now: now, refresh: refresh, tenants: map[string]*tenantDay{}}
}

// Day is the budget day of t: its UTC date.
func Day(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// ResetAt is when the budget day of now ends: the next UTC midnight (a parked task's not_before).
func ResetAt(now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// Hold is an estimate reserved against a tenant's budget; Settle it with what the call cost.
type Hold struct {
	b        *Budgets
	td       *tenantDay
	estimate float64
	once     sync.Once
}

// Reserve holds estimateUSD against tenant's daily budget limitUSD (0 means no limit: the spend is
// still counted). It returns ErrBudgetExhausted when what is known spent, reserved and estimated
// would pass the limit.
func (b *Budgets) Reserve(ctx context.Context, tenant string, limitUSD, estimateUSD float64) (*Hold, error) {
	now := b.now()
	day := Day(now)
	b.mu.Lock()
	td, ok := b.tenants[tenant+"/"+day]
	if !ok {
		td = &tenantDay{tenant: tenant, day: day}
		b.tenants[tenant+"/"+day] = td
	}
	stale := limitUSD > 0 && (td.readAt.IsZero() || now.Sub(td.readAt) >= b.refresh)
	b.mu.Unlock()
	if stale {
		total, err := b.store.Spent(ctx, tenant, day)
		if err != nil {
			return nil, fmt.Errorf("read budget of %s: %w", tenant, err)
		}
		b.mu.Lock()
		// The store already holds what this instance flushed; unflushed spend is added below.
		td.known, td.readAt = total, now
		b.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if limitUSD > 0 && td.known+td.unflushed+td.reserved+estimateUSD > limitUSD {
		return nil, fmt.Errorf("%w: %s spent $%.4f of $%.4f on %s", ErrBudgetExhausted, tenant, td.known+td.unflushed, limitUSD, day)
	}
	td.reserved += estimateUSD
	return &Hold{b: b, td: td, estimate: estimateUSD}, nil
}

// Settle releases the hold and counts actualUSD as spent; later calls do nothing.
func (h *Hold) Settle(actualUSD float64) {
	h.once.Do(func() {
		h.b.mu.Lock()
		defer h.b.mu.Unlock()
		h.td.reserved -= h.estimate
		h.td.unflushed += actualUSD
	})
}

// Flush writes every tenant's unflushed spend to the store and forgets finished days. Run it
// periodically and at shutdown; a failed write stays unflushed for the next Flush.
func (b *Budgets) Flush(ctx context.Context) error {
	type pending struct {
		td  *tenantDay
		usd float64
	}
	today := Day(b.now())
	var todo []pending
	b.mu.Lock()
	for key, td := range b.tenants {
		if td.unflushed > 0 {
			todo = append(todo, pending{td, td.unflushed})
			td.unflushed = 0
		} else if td.day != today && td.reserved <= 0 {
			delete(b.tenants, key)
		}
	}
	b.mu.Unlock()
	var errs []error
	for _, p := range todo {
		err := b.store.AddSpend(ctx, p.td.tenant, p.td.day, p.usd)
		b.mu.Lock()
		if err != nil {
			p.td.unflushed += p.usd
			errs = append(errs, fmt.Errorf("flush budget of %s: %w", p.td.tenant, err))
		} else {
			p.td.known += p.usd
		}
		b.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Slots caps the tasks of one tenant running at once on this instance, so one tenant's batch
// cannot starve the others. Safe for concurrent use.
type Slots struct {
	base time.Duration
	rand func() float64

	mu   sync.Mutex
	held map[string]int
}

// NewSlots returns Slots whose refusals suggest a retry after base to 2*base (jittered).
func NewSlots(base time.Duration) *Slots {
	return &Slots{base: base, rand: rand.Float64, held: map[string]int{}}
}

// Acquire takes one of tenant's limit slots (limit <= 0: no cap). When the tenant is at its cap it
// returns false and a short jittered delay: the task's not_before, so that a tenant's backlog
// does not come back all at once.
func (s *Slots) Acquire(tenant string, limit int) (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if limit > 0 && s.held[tenant] >= limit {
		return false, s.base + time.Duration(s.rand()*float64(s.base))
	}
	s.held[tenant]++
	return true, 0
}

// Release returns a slot Acquire granted.
func (s *Slots) Release(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant]--; s.held[tenant] <= 0 {
		delete(s.held, tenant)
	}
}

// InUse is the number of tenant's slots taken.
func (s *Slots) InUse(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[tenant]
}
