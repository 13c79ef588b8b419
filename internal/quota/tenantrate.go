package quota

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	Slot int64
	Span int
	// Current is the slot the lease is made in: Slot, or before it for a lease ahead (zero:
	// Slot). The slots from Current-Span on are kept, as the window of a lease made now for the
	// current slot counts them.
	Current int64
	Limit   Rate
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

// TenantRates enforces tenants' rpm and tpm across instances: each instance leases room in a
// tenant's window (what its calls asking need, up to a burst) from the RateStore, one transaction
// per lease, and spends it locally; a call's unused tokens are given back to the instance's
// allowance (or, the slot over, to the store with the next lease or Flush). Every leased amount
// counts against the window until given back, so the instances together never pass the limit in
// any window. Safe for concurrent use.
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
	lat          time.Duration // how long the last lease took to answer
	waiting      int           // refused calls waiting in process for roomAt (TakeOrWait)
	asking       atomic.Int64  // calls in take, waiting for mu or for room in process
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
// and when the call should try again, refused calls spread at the limit's pace; ErrRateTooLarge
// when tokens alone pass the tpm; the store's error when a lease fails.
func (r *TenantRates) Take(ctx context.Context, tenant string, limit Rate, tokens int64) (*RateHold, time.Time, error) {
	return r.take(ctx, tenant, limit, tokens, sendBack, nil, nil)
}

// TakeOrWait is Take for a caller that can wait in process for room. When there is none but it
// opens within a burst (RateBurst slots) and fewer of the tenant's calls than a lease can grant
// wait so on this instance, it waits for it: pause before, resume after (false calls the take
// off: ErrRateWaitOff), until ctx ends, and asks again. The calls waiting so ask again together
// when room opens and count in the lease the first makes (lease), so that it is spent whole in
// the slot it counts in, where refused calls sent back would reach the limiter one by one.
// Otherwise it is Take.
func (r *TenantRates) TakeOrWait(ctx context.Context, tenant string, limit Rate, tokens int64, pause func(), resume func() bool) (*RateHold, time.Time, error) {
	return r.take(ctx, tenant, limit, tokens, waitNear, pause, resume)
}

// ErrRateWaitOff means a call waiting in process for its tenant's room was called off by its
// caller (TakeOrWait's resume).
var ErrRateWaitOff = errors.New("quota: the wait for the tenant's rate was called off")

// refusal is what a refused call does: sent back at the limit's pace (Take), waiting in process
// when room is near (TakeOrWait), or waiting in process until room opens whenever that is (Wait).
type refusal int

const (
	sendBack refusal = iota
	waitNear
	waitAlways
)

// take is Take, a refused call doing as how says; one waiting near (waitNear) calls pause and
// resume around its wait, and is counted among those waiting until it has asked again.
func (r *TenantRates) take(ctx context.Context, tenant string, limit Rate, tokens int64, how refusal, pause func(), resume func() bool) (*RateHold, time.Time, error) {
	if limit.None() {
		return nil, time.Time{}, nil
	}
	if limit.Tokens > 0 && tokens > limit.Tokens {
		return nil, time.Time{}, fmt.Errorf("%w: %d tokens, tpm %d", ErrRateTooLarge, tokens, limit.Tokens)
	}
	need := RateUse{Requests: 1, Tokens: tokens}
	tr := r.tenant(tenant)
	tr.asking.Add(1)
	defer tr.asking.Add(-1)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	waiting := false
	defer func() {
		if waiting {
			tr.waiting--
		}
	}()
	if tr.limit != limit {
		tr.giveBack(tr.slot, tr.free)
		tr.free, tr.limit, tr.roomAt, tr.next = RateUse{}, limit, time.Time{}, time.Time{}
	}
	for leases := 0; ; {
		now := r.now()
		cur := r.callSlot(now)
		if tr.slot < cur {
			tr.giveBack(tr.slot, tr.free)
			tr.free, tr.slot = RateUse{}, cur
		}
		switch {
		case tr.free.covers(need, limit) && r.slotOf(now) == tr.slot:
			return tr.spend(r, limit, need, now), time.Time{}, nil
		case tr.free.covers(need, limit):
			// Leased for a slot about to start (lease, or the end of a slot: callSlot): wait
			// for it, letting others take too.
			if err := tr.unlocked(func() error { return r.sleep(ctx, r.slotStart(tr.slot)) }); err != nil {
				return nil, time.Time{}, err
			}
			continue
		case now.Before(tr.roomAt) || leases == leaseTries:
			room := r.slotStart(cur + 1)
			if tr.roomAt.After(room) {
				room = tr.roomAt
			}
			switch {
			case how == waitAlways:
				return nil, room, nil
			case how != waitNear || room.Sub(now) > RateBurst*r.slot || (!waiting && int64(tr.waiting) >= burstCalls(limit, need)):
				return nil, tr.later(now, limit, need, r.window+r.slot), nil
			}
			if !waiting {
				waiting = true
				tr.waiting++
			}
			err := tr.unlocked(func() error {
				pause()
				err := r.sleep(ctx, room)
				if resumed := resume(); err == nil && !resumed {
					err = ErrRateWaitOff
				}
				return err
			})
			if err != nil {
				return nil, time.Time{}, err
			}
			leases = 0
			continue
		}
		leases++
		if err := r.lease(ctx, tenant, tr, now, need); err != nil {
			return nil, time.Time{}, err
		}
	}
}

// unlocked runs fn with tr.mu, held, unlocked.
func (tr *tenantRate) unlocked(fn func() error) error {
	tr.mu.Unlock()
	defer tr.mu.Lock()
	return fn()
}

// spend takes need from what is free in the current slot; tr.mu is held.
func (tr *tenantRate) spend(r *TenantRates, limit Rate, need RateUse, now time.Time) *RateHold {
	took := need
	if limit.Requests <= 0 {
		took.Requests = 0
	}
	if limit.Tokens <= 0 {
		took.Tokens = 0
	}
	tr.free = tr.free.Sub(took)
	tr.next = now // the calls refused from now on come back from roomAt again
	return &RateHold{r: r, tr: tr, slot: tr.slot, took: took}
}

// leaseTries bounds the leases one Take makes when each answers after its slot has ended.
const leaseTries = 3

// Wait is Take that waits in process for room — until it opens, not paced as the calls sent
// back are, or a slot when a lease failed — until ctx ends. A nil hold means no limit applies.
func (r *TenantRates) Wait(ctx context.Context, tenant string, limit Rate, tokens int64) (*RateHold, error) {
	for {
		hold, at, err := r.take(ctx, tenant, limit, tokens, waitAlways, nil, nil)
		switch {
		case errors.Is(err, ErrRateTooLarge):
			return nil, err
		case err != nil:
			at = r.now().Add(r.slot)
		case hold != nil || at.IsZero():
			return hold, nil
		}
		if err := r.sleep(ctx, at); err != nil {
			return nil, err
		}
	}
}

// sleep waits until at by r's clock, or until ctx ends.
func (r *TenantRates) sleep(ctx context.Context, at time.Time) error {
	t := time.NewTimer(at.Sub(r.now()))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lease asks the store for the room tenant's calls on this instance need — at least need beyond
// what is free, and as much as the calls asking here need (in take, waiting for their turn or
// for room) or one slot's even share, whichever is more —, giving back the tenant's pending
// returns, and notes when to ask again; tr.mu is held. Sized so, a tenant's room is split between the instances that have its
// calls, and a busy instance leases about once a burst. It leases for the slot it expects to
// answer in, by how long the last lease took, so that a lease slower than a slot grants room a
// call made once it answers counts in; one that answers after that slot anyway leaves its room
// to be given back (take gives back a slot that has ended) and is asked again at once.
func (r *TenantRates) lease(ctx context.Context, tenant string, tr *tenantRate, now time.Time, need RateUse) error {
	if target := r.callSlot(now.Add(tr.lat + tr.lat/2)); target != tr.slot {
		tr.giveBack(tr.slot, tr.free)
		tr.free, tr.slot = RateUse{}, target
	}
	short := need.Sub(tr.free)
	calls := tr.asking.Load()
	l := RateLease{Tenant: tenant, Slot: tr.slot, Current: r.slotOf(now), Span: RateSlots, Limit: tr.limit,
		Need: RateUse{Requests: max(short.Requests, 0), Tokens: max(short.Tokens, 0)},
		Want: RateUse{Requests: max(calls*need.Requests, share(tr.limit.Requests)),
			Tokens: max(calls*need.Tokens, share(tr.limit.Tokens))},
		Returns: tr.returns}
	g, err := r.store.LeaseRate(ctx, l)
	if err != nil {
		return fmt.Errorf("lease the rate of tenant %s: %w", tenant, err)
	}
	answered := r.now()
	tr.lat = answered.Sub(now)
	tr.returns = nil
	tr.free = tr.free.Add(g.Got)
	switch {
	case r.callSlot(answered) > tr.slot && g.Got != (RateUse{}):
		tr.roomAt = time.Time{} // too late to be spent: ask again at once
	case roomOf(g.Window, tr.limit, need).covers(need, tr.limit):
		tr.roomAt = time.Time{} // room is left for the next call that needs it
	default: // the lease took all the room there was: ask again once the window has room
		tr.roomAt = r.slotStart(tr.slot + roomIn(g.Window, tr.limit, need))
	}
	return nil
}

// share is one slot's even share of limit, 1/(RateSlots+1) of it rounded up.
func share(limit int64) int64 { return (max(limit, 0) + RateSlots) / (RateSlots + 1) }

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

// Late reports whether a call made now would count in a later slot than the one h was taken in
// (callSlot), which did not count it. Settle it with no call, and take again.
func (h *RateHold) Late() bool { return h.r.callSlot(h.r.now()) != h.slot }

// burstCalls is how many calls of need one lease can grant at most: a burst's even shares.
func burstCalls(limit Rate, need RateUse) int64 {
	calls := int64(-1)
	for _, p := range [][2]int64{{limit.Requests, need.Requests}, {limit.Tokens, need.Tokens}} {
		if p[0] <= 0 || p[1] <= 0 {
			continue
		}
		n := int64(RateBurst) * share(p[0]) / p[1]
		if calls < 0 || n < calls {
			calls = n
		}
	}
	return max(calls, 1)
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
		if h.slot == tr.slot && h.slot == h.r.callSlot(h.r.now()) && unused.Requests >= 0 && unused.Tokens >= 0 {
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
		if slot := r.callSlot(r.now()); tr.slot < slot {
			tr.giveBack(tr.slot, tr.free)
			tr.free, tr.slot = RateUse{}, slot
		}
		if len(tr.returns) > 0 {
			l := RateLease{Tenant: p.tenant, Slot: tr.slot, Current: r.slotOf(r.now()), Span: RateSlots, Limit: tr.limit, Returns: tr.returns}
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

// callSlot is the slot a call made at t counts in: the slot it reaches the model in, allowing
// it a quarter of a slot to get there. A call is made only once its slot has started, so calls
// are made in the first three quarters of their slot, and one on its way when a window ends
// does not reach the model inside the next unless its way takes longer.
func (r *TenantRates) callSlot(t time.Time) int64 { return r.slotOf(t.Add(r.slot / 4)) }

func (r *TenantRates) slotStart(slot int64) time.Time { return time.Unix(0, slot*int64(r.slot)) }
