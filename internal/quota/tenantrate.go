package quota

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Rate is a tenant's share of the model quota: requests and tokens per window (a minute for rpm
// and tpm). A zero part is no limit.
type Rate struct {
	Requests, Tokens int64
}

// None reports whether r limits nothing.
func (r Rate) None() bool { return r.Requests <= 0 && r.Tokens <= 0 }

// RateUse is an amount of requests and tokens: leased, used or given back.
type RateUse struct {
	Requests, Tokens int64
}

// Add is u plus o.
func (u RateUse) Add(o RateUse) RateUse {
	return RateUse{Requests: u.Requests + o.Requests, Tokens: u.Tokens + o.Tokens}
}

// Sub is u minus o.
func (u RateUse) Sub(o RateUse) RateUse {
	return RateUse{Requests: u.Requests - o.Requests, Tokens: u.Tokens - o.Tokens}
}

// covers reports whether u holds need in every part r limits.
func (u RateUse) covers(need RateUse, r Rate) bool {
	return (r.Requests <= 0 || u.Requests >= need.Requests) && (r.Tokens <= 0 || u.Tokens >= need.Tokens)
}

// RateLease is one lease of a tenant's allowance in one transaction of the shared document.
type RateLease struct {
	Tenant string
	// Slot is the slot leased for; Span is how many slots before it count with it, so that
	// every Span+1 consecutive slots together stay within Limit.
	Slot  int64
	Span  int
	Limit Rate
	// Need is the least worth granting: a lease whose room is short of it in a limited part
	// grants nothing. Want is what to take when there is room for more (at least Need).
	Need, Want RateUse
	// Returns is what this instance leased in earlier slots (or Slot) and did not use, by slot,
	// given back before the lease; a negative part charges what a slot used beyond its lease.
	Returns map[int64]RateUse
}

// RateGrant is the outcome of a RateLease.
type RateGrant struct {
	// Got is what was granted: zero when the room was short of Need.
	Got RateUse
	// Window is what the Span+1 slots up to Slot hold after the lease, oldest first.
	Window []RateUse
}

// RateStore keeps every tenant's leased allowance per slot, shared by all instances.
type RateStore interface {
	// LeaseRate applies l.Returns and then grants, in one transaction, what l asks within the
	// room l.Limit leaves in the Span+1 slots up to l.Slot.
	LeaseRate(ctx context.Context, l RateLease) (RateGrant, error)
}

// Grant is the pure rule of RateLease, applied by a RateStore inside its transaction to the
// slots it read (after Returns): what to grant from window (oldest first, ending with l.Slot's)
// and the window after it. The grant fits the room the limit leaves in the whole window and in
// the even share of its last RateBurst slots — RateBurst 1/(Span+1) parts, which one call may
// pass by what it needs less one — so that a tenant kept busy calls at an even pace, every
// RateBurst slots, and any window holds nearly its whole limit. A part without a limit is not
// counted.
func (l RateLease) Grant(window []RateUse) RateGrant {
	room := roomOf(window, l.Limit, l.Need)
	if !room.covers(l.Need, l.Limit) {
		return RateGrant{Window: window}
	}
	var got RateUse
	if l.Limit.Requests > 0 {
		got.Requests = max(min(max(l.Want.Requests, l.Need.Requests), room.Requests), 0)
	}
	if l.Limit.Tokens > 0 {
		got.Tokens = max(min(max(l.Want.Tokens, l.Need.Tokens), room.Tokens), 0)
	}
	out := append([]RateUse(nil), window...)
	out[len(out)-1] = out[len(out)-1].Add(got)
	return RateGrant{Got: got, Window: out}
}

// ErrRateTooLarge means one call's worst case is more than the tenant's whole limit: it would
// never fit in a window.
var ErrRateTooLarge = errors.New("quota: a call's worst case exceeds the tenant's rate limit")

// RateSlots is the number of slots in a window: a lease counts the window's slots before its own,
// so a tenant kept busy gets RateSlots/(RateSlots+1) of its limit in any window and never more.
const RateSlots = 60

// RateBurst is how many slots' even shares one slot may use, when the slots before it used
// none: the tasks of a tenant come back in bursts, each sweep pass (GENBOX_SWEEP_INTERVAL, 5 s)
// finding those whose not_before passed, and a slot's share alone would leave the others' unused.
const RateBurst = 10

// TenantRates enforces tenants' rpm and tpm across instances: each instance leases the room a
// tenant's window has (up to a burst) from the RateStore, one transaction per lease, and spends
// it locally; a
// call's unused tokens are given back to the instance's allowance (or, the slot over, to the store
// with the next lease or Flush). Every leased amount counts against the window until given back, so the
// instances together never pass the limit in any window. Safe for concurrent use.
type TenantRates struct {
	store  RateStore
	now    func() time.Time
	window time.Duration
	slot   time.Duration

	mu      sync.Mutex
	tenants map[string]*tenantRate
}

// tenantRate is one tenant's allowance on this instance.
type tenantRate struct {
	mu      sync.Mutex // one lease of the tenant at a time on this instance
	limit   Rate       // the limit of the last lease: a changed one starts afresh
	slot    int64      // the slot free belongs to
	free    RateUse    // leased for slot and not yet taken
	returns map[int64]RateUse
	// roomAt is when the store's window, as last read, has room again for a call refused; no
	// lease is tried before then. next is the time the next refused call is told to come back:
	// refused calls are spread at the limit's pace from roomAt, not all sent back at once.
	roomAt, next time.Time
}

// NewTenantRates returns TenantRates over store whose limits count per window (time.Minute for
// rpm and tpm).
func NewTenantRates(store RateStore, now func() time.Time, window time.Duration) *TenantRates {
	return &TenantRates{store: store, now: now, window: window, slot: window / RateSlots, tenants: map[string]*tenantRate{}}
}

// RateHold is what Take took for one call; Settle it with what the call used.
type RateHold struct {
	r    *TenantRates
	tr   *tenantRate
	slot int64
	took RateUse
	once sync.Once
}

// Take takes one request and tokens, a call's worst case, from tenant's allowance under limit.
// A nil hold and a zero time mean no limit applies. When there is no room it returns a nil hold
// and when the call should try again; ErrRateTooLarge when tokens alone pass the tpm; the
// store's error when a lease fails.
func (r *TenantRates) Take(ctx context.Context, tenant string, limit Rate, tokens int64) (*RateHold, time.Time, error) {
	if limit.None() {
		return nil, time.Time{}, nil
	}
	if limit.Tokens > 0 && tokens > limit.Tokens {
		return nil, time.Time{}, fmt.Errorf("%w: %d tokens, tpm %d", ErrRateTooLarge, tokens, limit.Tokens)
	}
	need := RateUse{Requests: 1, Tokens: tokens}
	tr := r.tenant(tenant)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	now := r.now()
	slot := r.slotOf(now)
	if tr.limit != limit {
		tr.giveBack(tr.slot, tr.free)
		tr.free, tr.limit, tr.roomAt, tr.next = RateUse{}, limit, time.Time{}, time.Time{}
	}
	if tr.slot != slot {
		tr.giveBack(tr.slot, tr.free)
		tr.free, tr.slot = RateUse{}, slot
	}
	if !tr.free.covers(need, limit) {
		if now.Before(tr.roomAt) {
			return nil, tr.later(now, limit, need, r.window+r.slot), nil
		}
		for tries := 1; ; tries++ {
			if err := r.lease(ctx, tenant, tr, slot, need); err != nil {
				return nil, time.Time{}, err
			}
			// A lease that answered after its slot ended granted room in that slot, where a
			// call made now would not count: the room is given back, and asked for again in the
			// slot it is now.
			now = r.now()
			cur := r.slotOf(now)
			if cur == slot {
				break
			}
			tr.giveBack(slot, tr.free)
			tr.free, tr.slot, slot = RateUse{}, cur, cur
			if tries == leaseTries {
				return nil, tr.later(now, limit, need, r.window+r.slot), nil
			}
		}
		if !tr.free.covers(need, limit) {
			return nil, tr.later(now, limit, need, r.window+r.slot), nil
		}
	}
	took := RateUse{Requests: min(need.Requests, tr.free.Requests), Tokens: min(need.Tokens, tr.free.Tokens)}
	if limit.Requests <= 0 {
		took.Requests = 0
	}
	if limit.Tokens <= 0 {
		took.Tokens = 0
	}
	tr.free = tr.free.Sub(took)
	tr.next = now // the calls refused from now on come back from roomAt again
	return &RateHold{r: r, tr: tr, slot: slot, took: took}, time.Time{}, nil
}

// leaseTries bounds the leases one Take makes when each answers after its slot has ended.
const leaseTries = 3

// Wait is Take that waits for room — until the time Take gave, or a slot when a lease failed —
// until ctx ends. A nil hold means no limit applies.
func (r *TenantRates) Wait(ctx context.Context, tenant string, limit Rate, tokens int64) (*RateHold, error) {
	for {
		hold, at, err := r.Take(ctx, tenant, limit, tokens)
		switch {
		case errors.Is(err, ErrRateTooLarge):
			return nil, err
		case err != nil:
			at = r.now().Add(r.slot)
		case hold != nil || at.IsZero():
			return hold, nil
		}
		t := time.NewTimer(at.Sub(r.now()))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// lease asks the store for all the room tenant has in slot — at least need beyond what is free —,
// giving back the tenant's pending returns, and notes when to ask again; tr.mu is held.
func (r *TenantRates) lease(ctx context.Context, tenant string, tr *tenantRate, slot int64, need RateUse) error {
	short := need.Sub(tr.free)
	l := RateLease{Tenant: tenant, Slot: slot, Span: RateSlots, Limit: tr.limit,
		Need:    RateUse{Requests: max(short.Requests, 0), Tokens: max(short.Tokens, 0)},
		Want:    RateUse(tr.limit), // all the room there is: one lease a burst
		Returns: tr.returns}
	g, err := r.store.LeaseRate(ctx, l)
	if err != nil {
		return fmt.Errorf("lease the rate of tenant %s: %w", tenant, err)
	}
	tr.returns = nil
	tr.free = tr.free.Add(g.Got)
	// The lease took all the room there was (Want is the whole limit): the next is worth asking
	// for once the window has room again.
	tr.roomAt = r.slotStart(slot + roomIn(g.Window, tr.limit, need))
	return nil
}

// roomOf is the room window (oldest first, ending with the slot leased for) leaves under limit
// for a lease of need: what the whole window leaves, and its last RateBurst slots' even shares.
func roomOf(window []RateUse, limit Rate, need RateUse) RateUse {
	var used, recent RateUse
	for i, u := range window {
		used = used.Add(u)
		if i >= len(window)-RateBurst {
			recent = recent.Add(u)
		}
	}
	share := func(limit, need int64) int64 {
		return int64(RateBurst)*((limit+int64(len(window))-1)/int64(len(window))) + max(need-1, 0)
	}
	return RateUse{
		Requests: min(limit.Requests-used.Requests, share(limit.Requests, need.Requests)-recent.Requests),
		Tokens:   min(limit.Tokens-used.Tokens, share(limit.Tokens, need.Tokens)-recent.Tokens),
	}
}

// roomIn is how many slots after the last of window (oldest first) a lease of need finds room
// under limit, as the window's oldest slots leave it: at least 1.
func roomIn(window []RateUse, limit Rate, need RateUse) int64 {
	for k := 1; k < len(window); k++ {
		later := append(append([]RateUse(nil), window[k:]...), make([]RateUse, k)...)
		if roomOf(later, limit, need).covers(need, limit) {
			return int64(k)
		}
	}
	return int64(len(window))
}

// later is when a refused call of need is to come back: from roomAt on (or the next slot), one
// call's share of the window at a time, so that a backlog comes back at the pace its limit lets
// through instead of all at once; tr.mu is held.
func (tr *tenantRate) later(now time.Time, limit Rate, need RateUse, span time.Duration) time.Time {
	perWindow := int64(0)
	if limit.Requests > 0 {
		perWindow = limit.Requests
	}
	if limit.Tokens > 0 && need.Tokens > 0 {
		if n := limit.Tokens / need.Tokens; perWindow == 0 || n < perWindow {
			perWindow = n
		}
	}
	at := tr.roomAt
	if at.Before(tr.next) {
		at = tr.next
	}
	if at.Before(now) {
		at = now
	}
	tr.next = at.Add(span / time.Duration(max(perWindow, 1)))
	return at
}

// giveBack adds u, unused in slot, to what the next lease gives back; tr.mu is held.
func (tr *tenantRate) giveBack(slot int64, u RateUse) {
	if u == (RateUse{}) {
		return
	}
	if tr.returns == nil {
		tr.returns = map[int64]RateUse{}
	}
	tr.returns[slot] = tr.returns[slot].Add(u)
}

// Settle gives back what the call did not use of what Take took — calls is the requests it made
// and tokens what it used (usageMetadata, plus any in doubt) — to the instance's allowance while
// its slot lasts, to the store after. Use beyond the take (tokens beyond the estimate) is charged
// to the slot. Later calls do nothing.
func (h *RateHold) Settle(calls, tokens int64) {
	h.once.Do(func() {
		used := RateUse{Requests: calls, Tokens: tokens}
		if h.took.Requests == 0 {
			used.Requests = 0
		}
		if h.took.Tokens == 0 {
			used.Tokens = 0
		}
		unused := h.took.Sub(used)
		tr := h.tr
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if h.slot == tr.slot && h.slot == h.r.slotOf(h.r.now()) && unused.Requests >= 0 && unused.Tokens >= 0 {
			tr.free = tr.free.Add(unused)
			return
		}
		tr.giveBack(h.slot, unused)
	})
}

// Flush gives back to the store what every tenant has pending — the unused allowance of past
// slots and tokens settled after their slot — so that an instance gone quiet holds none of the
// window. Run it every few seconds, and at shutdown.
func (r *TenantRates) Flush(ctx context.Context) error {
	r.mu.Lock()
	type pending struct {
		tenant string
		tr     *tenantRate
	}
	var todo []pending
	for tenant, tr := range r.tenants {
		todo = append(todo, pending{tenant, tr})
	}
	r.mu.Unlock()
	var errs []error
	for _, p := range todo {
		tr := p.tr
		tr.mu.Lock()
		if slot := r.slotOf(r.now()); tr.slot != slot {
			tr.giveBack(tr.slot, tr.free)
			tr.free, tr.slot = RateUse{}, slot
		}
		if len(tr.returns) > 0 {
			l := RateLease{Tenant: p.tenant, Slot: tr.slot, Span: RateSlots, Limit: tr.limit, Returns: tr.returns}
			if _, err := r.store.LeaseRate(ctx, l); err != nil {
				errs = append(errs, fmt.Errorf("give back the rate of tenant %s: %w", p.tenant, err))
			} else {
				tr.returns = nil
			}
		}
		tr.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (r *TenantRates) tenant(tenant string) *tenantRate {
	r.mu.Lock()
	defer r.mu.Unlock()
	tr, ok := r.tenants[tenant]
	if !ok {
		tr = &tenantRate{}
		r.tenants[tenant] = tr
	}
	return tr
}

func (r *TenantRates) slotOf(t time.Time) int64 { return t.UnixNano() / int64(r.slot) }

func (r *TenantRates) slotStart(slot int64) time.Time { return time.Unix(0, slot*int64(r.slot)) }
