// Package quota keeps what a genbox deployment lets each tenant spend: the daily budgets (each
// tenant's and the project's, counted in the store's sharded counters, reserved before a call and
// settled after it). It is genbox's policy, not the model client's: pkg/gemini prices calls, this
// package limits them.
package quota

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
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
var ErrBudgetExhausted = errors.New("quota: tenant daily budget exhausted")

// ErrProjectBudgetExhausted means the project's daily budget (WithProjectLimit) has no room for
// the estimate; no call was made. It is not an ErrBudgetExhausted: the tenant is not at fault.
var ErrProjectBudgetExhausted = errors.New("quota: project daily budget exhausted")

// ProjectCounter is the tenant name of the project's counter, which counts every tenant's spend
// once more: no tenant can have it (tenant ids start with a letter or a digit).
const ProjectCounter = "_project"

// SpendFlush is one batch of an instance's spend on a tenant's day. Origin names the Budgets that
// wrote it (one per process) and Seq rises with every batch it writes, so that the store can
// count a batch once however often it is retried.
type SpendFlush struct {
	Tenant, Day, Origin string
	Seq                 int64
	USD                 float64
}

// SpendStore keeps each tenant's daily spend in sharded counters, so that no single document
// serializes every task.
type SpendStore interface {
	// AddSpend adds f.USD to the tenant's counter for the day unless a batch of f.Origin with a
	// Seq of at least f.Seq is counted already: a batch retried after a write with an unknown
	// outcome counts once.
	AddSpend(ctx context.Context, f SpendFlush) error
	// Spent returns the tenant's total for the day and the Seq of the last batch of origin that
	// total includes (0 when none).
	Spent(ctx context.Context, tenant, day, origin string) (total float64, applied int64, err error)
}

// Budgets enforces per-tenant daily budgets as a soft limit: each instance reserves estimates in
// memory against the total it last read from the store, and flushes what it spent in batches.
// Instances may overshoot together by what they reserve between refreshes. Every dollar is
// counted once: a batch is in the known total or in flight, never both, and a retried batch is
// not added twice. Safe for concurrent use.
type Budgets struct {
	store   SpendStore
	now     func() time.Time
	refresh time.Duration
	origin  string
	project float64 // the project's daily limit; 0: none, and no project counter

	flushing sync.Mutex // one Flush at a time: each tenant's batches are written in order

	mu      sync.Mutex
	seq     int64                 // the last batch's Seq
	tenants map[string]*tenantDay // tenant + "/" + day
}

type tenantDay struct {
	tenant, day string
	known       float64   // the store's total as last read, plus the batches written since
	applied     int64     // the last batch of this instance that known includes
	readAt      time.Time // when the read behind known started
	reserved    float64   // estimates of calls under way
	batches     []batch   // spend flushed or being flushed, not yet in known, oldest first
	unflushed   float64   // spent here, not yet in a batch
	// reading is closed when the read under way ends, with readErr its error: the reserves
	// that find the total stale meanwhile are served known, or wait for the read (current),
	// instead of each reading the store.
	reading chan struct{}
	readErr error
}

// batch is spend handed to the store as one SpendFlush.
type batch struct {
	seq int64
	usd float64
}

// counted is all of the day's spend this instance knows of: the store's, its own in flight and
// not yet flushed, and its reservations.
func (td *tenantDay) counted() float64 {
	c := td.known + td.unflushed + td.reserved
	for _, b := range td.batches {
		c += b.usd
	}
	return c
}

// read takes a total read from the store that started at at and includes this instance's
// batches up to applied. A read that started before the one behind known, or that misses a batch
// known already includes (it raced that batch's write), is older news and is dropped.
func (td *tenantDay) read(total float64, applied int64, at time.Time) {
	if applied < td.applied || at.Before(td.readAt) {
		return
	}
	td.known, td.applied, td.readAt = total, applied, at
	td.batches = slices.DeleteFunc(td.batches, func(b batch) bool { return b.seq <= applied })
}

// written moves batch b, now in the store, into known, unless a read already did.
func (td *tenantDay) written(b batch) {
	i := slices.Index(td.batches, b)
	if i < 0 {
		return
	}
	td.batches = slices.Delete(td.batches, i, i+1)
	td.known += b.usd
	td.applied = max(td.applied, b.seq)
}

// BudgetsOption configures Budgets.
type BudgetsOption func(*Budgets)

// WithProjectLimit caps the spend of every tenant together at usd a day (0: no cap), as a soft
// limit like a tenant's, counted in the ProjectCounter's counters. It fails closed: a Reserve
// whose project total cannot be read reserves nothing and returns the read's error.
func WithProjectLimit(usd float64) BudgetsOption { return func(b *Budgets) { b.project = usd } }

// NewBudgets returns Budgets over store that re-reads a tenant's total at most every refresh.
func NewBudgets(store SpendStore, now func() time.Time, refresh time.Duration, opts ...BudgetsOption) *Budgets {
	var id [8]byte
	_, _ = crand.Read(id[:]) // never fails (crypto/rand)
	b := &Budgets{store: store, now: now, refresh: refresh, origin: "b" + hex.EncodeToString(id[:]), tenants: map[string]*tenantDay{}}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Day is the budget day of t: its UTC date.
func Day(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// ResetAt is when the budget day of now ends: the next UTC midnight (a parked task's not_before).
func ResetAt(now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// Hold is an estimate reserved against a tenant's budget (and the project's, when limited);
// Settle it with what the call cost, or Keep it.
type Hold struct {
	b        *Budgets
	td, pd   *tenantDay // the tenant's day and the project's (nil without a project limit)
	estimate float64
	once     sync.Once
}

// Charge is a hold kept past the process that reserved it (Hold.Keep): its estimate, counted as
// the tenant's spend on Day until SettleCharge puts what was actually spent in its place.
type Charge struct {
	Tenant, Day string
	USD         float64
}

// Reserve holds estimateUSD against tenant's daily budget limitUSD (0 means no limit: the spend is
// still counted) and the project's (WithProjectLimit). It returns ErrBudgetExhausted when what is
// known spent, reserved and estimated would pass the tenant's limit, ErrProjectBudgetExhausted
// when it would pass the project's, and the store's error when a total it must check cannot be
// read; it reserves nothing then.
func (b *Budgets) Reserve(ctx context.Context, tenant string, limitUSD, estimateUSD float64) (*Hold, error) {
	now := b.now()
	day := Day(now)
	td, err := b.current(ctx, tenant, day, limitUSD > 0, now)
	if err != nil {
		return nil, fmt.Errorf("read budget of %s: %w", tenant, err)
	}
	var pd *tenantDay
	if b.project > 0 {
		if pd, err = b.current(ctx, ProjectCounter, day, true, now); err != nil {
			return nil, fmt.Errorf("read the project's budget: %w", err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if spent := td.counted(); limitUSD > 0 && spent+estimateUSD > limitUSD {
		return nil, fmt.Errorf("%w: %s spent $%.4f of $%.4f on %s", ErrBudgetExhausted, tenant, spent-td.reserved, limitUSD, day)
	}
	if pd != nil {
		if spent := pd.counted(); spent+estimateUSD > b.project {
			return nil, fmt.Errorf("%w: every tenant together spent $%.4f of $%.4f on %s", ErrProjectBudgetExhausted, spent-pd.reserved, b.project, day)
		}
		pd.reserved += estimateUSD
	}
	td.reserved += estimateUSD
	return &Hold{b: b, td: td, pd: pd, estimate: estimateUSD}, nil
}

// current returns tenant's day, re-reading its total from the store first when checked says it
// is checked against a limit and the total is older than the refresh interval: one read at a
// time. While it re-reads a total it read before, the others are served that total, as they were
// a moment earlier — a reserve waits on no read, so a refresh never stalls every call at once —,
// unless the total has gone unread for two refresh intervals (the re-reads failing, or one
// hanging), when they wait for the read and fail closed with its error. A first read is waited
// for by all.
func (b *Budgets) current(ctx context.Context, tenant, day string, checked bool, now time.Time) (*tenantDay, error) {
	b.mu.Lock()
	td := b.dayOf(tenant, day)
	stale := checked && (td.readAt.IsZero() || now.Sub(td.readAt) >= b.refresh)
	if !stale {
		b.mu.Unlock()
		return td, nil
	}
	if reading := td.reading; reading != nil {
		if !td.readAt.IsZero() && now.Sub(td.readAt) < 2*b.refresh {
			b.mu.Unlock()
			return td, nil
		}
		b.mu.Unlock()
		select {
		case <-reading:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		b.mu.Lock()
		err := td.readErr
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return td, nil
	}
	reading := make(chan struct{})
	td.reading = reading
	b.mu.Unlock()
	total, applied, err := b.store.Spent(ctx, tenant, day, b.origin)
	b.mu.Lock()
	if err == nil {
		td.read(total, applied, now)
	}
	td.reading, td.readErr = nil, err
	close(reading)
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return td, nil
}

// Prefetch reads, when they are stale, the totals a Reserve for tenant will check — the tenant's
// when checked says its budget is limited, the project's when it has a limit — side by side, so
// that a caller can start them before the Reserve (the worker, as it receives a task, while it
// claims it). Errors are left to the Reserve, whose own read decides.
func (b *Budgets) Prefetch(ctx context.Context, tenant string, checked bool) {
	now := b.now()
	day := Day(now)
	var wg sync.WaitGroup
	if checked {
		wg.Go(func() { _, _ = b.current(ctx, tenant, day, true, now) })
	}
	if b.project > 0 {
		wg.Go(func() { _, _ = b.current(ctx, ProjectCounter, day, true, now) })
	}
	wg.Wait()
}

// dayOf returns tenant's day, created empty if new; b.mu must be held.
func (b *Budgets) dayOf(tenant, day string) *tenantDay {
	td, ok := b.tenants[tenant+"/"+day]
	if !ok {
		td = &tenantDay{tenant: tenant, day: day}
		b.tenants[tenant+"/"+day] = td
	}
	return td
}

// Record counts usd spent by tenant that no Reserve held — spend known only once paid (a context
// cache's storage): it checks no limit and reads nothing.
func (b *Budgets) Record(tenant string, usd float64) { b.record(tenant, Day(b.now()), usd) }

func (b *Budgets) record(tenant, day string, usd float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dayOf(tenant, day).unflushed += usd
	if b.project > 0 {
		b.dayOf(ProjectCounter, day).unflushed += usd
	}
}

// SettleCharge puts actualUSD in the place of charge c on its day: the difference is counted
// (negative when the call cost less than its estimate, as it nearly always does). A charge
// without a day (none was reserved) counts actualUSD today. Call it once per charge.
func (b *Budgets) SettleCharge(c Charge, actualUSD float64) {
	day := c.Day
	if day == "" {
		day = Day(b.now())
	}
	if d := actualUSD - c.USD; d != 0 {
		b.record(c.Tenant, day, d)
	}
}

// Charge is what Keep would keep: the hold's estimate, on the tenant's day it was reserved on.
func (h *Hold) Charge() Charge { return Charge{Tenant: h.td.tenant, Day: h.td.day, USD: h.estimate} }

// Keep settles the hold at its whole estimate, which becomes the tenant's spend — flushed to the
// counters every instance reads — so that the reservation outlives this process: a call answered
// hours later, by whichever instance, settles it with SettleCharge(h.Charge(), cost).
func (h *Hold) Keep() { h.Settle(h.estimate) }

// Settle releases the hold and counts actualUSD as spent; later calls do nothing.
func (h *Hold) Settle(actualUSD float64) {
	h.once.Do(func() {
		h.b.mu.Lock()
		defer h.b.mu.Unlock()
		for _, d := range []*tenantDay{h.td, h.pd} {
			if d != nil {
				d.reserved -= h.estimate
				d.unflushed += actualUSD
			}
		}
	})
}

// Flush writes every tenant's unflushed spend to the store as a new batch, after the batches
// still unwritten, and forgets finished days. Run it periodically and at shutdown. A batch whose
// write failed is written again, first, by the next Flush, with the same Seq: if the failed write
// had in fact landed, the store does not count it twice.
func (b *Budgets) Flush(ctx context.Context) error {
	b.flushing.Lock()
	defer b.flushing.Unlock()
	today := Day(b.now())
	var todo []*tenantDay
	b.mu.Lock()
	for key, td := range b.tenants {
		if td.unflushed != 0 { // a settled charge may give spend back
			b.seq++
			td.batches = append(td.batches, batch{seq: b.seq, usd: td.unflushed})
			td.unflushed = 0
		}
		switch {
		case len(td.batches) > 0:
			todo = append(todo, td)
		case td.day != today && td.reserved <= 0:
			delete(b.tenants, key)
		}
	}
	b.mu.Unlock()
	var errs []error
	for _, td := range todo {
		b.mu.Lock()
		pending := slices.Clone(td.batches)
		b.mu.Unlock()
		for _, bt := range pending {
			err := b.store.AddSpend(ctx, SpendFlush{Tenant: td.tenant, Day: td.day, Origin: b.origin, Seq: bt.seq, USD: bt.usd})
			if err != nil {
				errs = append(errs, fmt.Errorf("flush budget of %s: %w", td.tenant, err))
				break // a later batch landing first would make this one look counted
			}
			b.mu.Lock()
			td.written(bt)
			b.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}
