package quota_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/quota"
)

func TestRateLeaseGrant(t *testing.T) {
	t.Parallel()
	// window is a lease's window: old in its oldest slot, recent in its last ones.
	window := func(old quota.RateUse, recent ...quota.RateUse) []quota.RateUse {
		w := make([]quota.RateUse, quota.RateSlots+1)
		w[0] = old
		copy(w[len(w)-len(recent):], recent)
		return w
	}
	calls := func(n int64) quota.RateUse { return quota.RateUse{Requests: n} }
	rpm := quota.RateLease{Limit: quota.Rate{Requests: 122}, Need: calls(1), Want: calls(122)} // a share: 2 calls
	tests := []struct {
		name   string
		lease  quota.RateLease
		window []quota.RateUse
		want   quota.RateUse
	}{
		{"an empty window grants a burst's shares", rpm, window(quota.RateUse{}), calls(2 * quota.RateBurst)},
		{"a burst's shares taken by the last slots, nothing", rpm, window(quota.RateUse{}, calls(2*quota.RateBurst-2), quota.RateUse{}, calls(2)), quota.RateUse{}},
		{"what the last slots left of the burst", rpm, window(quota.RateUse{}, calls(5)), calls(2*quota.RateBurst - 5)},
		{"a full window, nothing", rpm, window(calls(122)), quota.RateUse{}},
		{"what the window has left", rpm, window(calls(121)), calls(1)},
		{"one call may pass the burst by its need less one", quota.RateLease{Limit: quota.Rate{Tokens: 6100}, Need: quota.RateUse{Tokens: 500}, Want: quota.RateUse{Tokens: 6100}},
			window(quota.RateUse{}), quota.RateUse{Tokens: 100*quota.RateBurst + 499}},
		{"a part without a limit is not counted", quota.RateLease{Limit: quota.Rate{Tokens: 6100}, Need: quota.RateUse{Requests: 1, Tokens: 50}, Want: quota.RateUse{Requests: 5, Tokens: 6100}},
			window(quota.RateUse{}, calls(1000)), quota.RateUse{Tokens: 100*quota.RateBurst + 49}},
	}
	for _, tc := range tests {
		if got := tc.lease.Grant(tc.window).Got; got != tc.want {
			t.Errorf("%s: granted %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// memRates is an in-memory RateStore applying RateLease.Grant to one tenant's slots, counting
// its leases.
type memRates struct {
	slots  map[int64]quota.RateUse
	leases int
}

func (m *memRates) LeaseRate(_ context.Context, l quota.RateLease) (quota.RateGrant, error) {
	m.leases++
	for n, u := range l.Returns {
		m.slots[n] = m.slots[n].Sub(u)
	}
	first := l.Slot - int64(l.Span)
	w := make([]quota.RateUse, l.Span+1)
	for i := range w {
		w[i] = m.slots[first+int64(i)]
	}
	g := l.Grant(w)
	m.slots[l.Slot] = g.Window[l.Span]
	return g, nil
}

// A refused call learns when to come back — once the window has room, the next refused ones a
// call's share of the minute apart — and tokens a call did not use go back to the instance's
// allowance without a lease.
func TestTenantRatesTake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := &memRates{slots: map[int64]quota.RateUse{}}
	now := time.Unix(1_800_000_000, 0)
	r := quota.NewTenantRates(st, func() time.Time { return now }, time.Minute)
	limit := quota.Rate{Requests: 61, Tokens: 61_000} // a share: 1 call, 1,000 tokens

	var took int
	var refused []time.Time
	for {
		hold, at, err := r.Take(ctx, "acme", limit, 500)
		if err != nil {
			t.Fatal(err)
		}
		if hold == nil {
			refused = append(refused, at)
			break
		}
		hold.Settle(1, 100) // 400 tokens back: the calls run out first
		took++
	}
	if took != quota.RateBurst {
		t.Errorf("%d calls in the first slot, want a burst's %d", took, quota.RateBurst)
	}
	leased := st.leases
	for range 2 {
		h, at, err := r.Take(ctx, "acme", limit, 500)
		if err != nil || h != nil {
			t.Fatalf("take beyond the burst: %v, %v", h, err)
		}
		refused = append(refused, at)
	}
	room := now.Add(quota.RateBurst * time.Second) // the first slot leaves the burst's slots
	pace := (time.Minute + time.Second) / 61
	want := []time.Time{room, room.Add(pace), room.Add(2 * pace)}
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("refused calls come back at (-want +got):\n%s", diff)
	}
	if st.leases != leased {
		t.Errorf("%d leases for two refusals, want none: the last lease found no room, so refusals until it opens again cost none", st.leases-leased)
	}

	now = room
	hold, _, err := r.Take(ctx, "acme", limit, 500)
	if err != nil || hold == nil {
		t.Fatalf("take once there is room: %v, %v", hold, err)
	}
	hold.Settle(1, 100)
	if got, want := st.slots[1_800_000_000], (quota.RateUse{Requests: quota.RateBurst, Tokens: 100 * quota.RateBurst}); got != want {
		t.Errorf("the first slot holds %+v after its unused share was given back, want %+v", got, want)
	}

	if _, _, err := r.Take(ctx, "acme", limit, 70_000); !errors.Is(err, quota.ErrRateTooLarge) {
		t.Errorf("a call above the whole tpm: %v, want ErrRateTooLarge", err)
	}
	if h, at, err := r.Take(ctx, "other", quota.Rate{}, 1_000_000); h != nil || !at.IsZero() || err != nil {
		t.Errorf("a tenant without limits: %v, %v, %v; want no hold", h, at, err)
	}
}

// Calls asking together take room in a lease sized to them (at most a burst), not one lease a
// call: while the first lease is under way the others wait for it, and the next lease asks for
// all of them; a call alone leases one slot's even share.
func TestTenantRatesLeaseSizedToTheCallsAsking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := &countingRates{memRates: memRates{slots: map[int64]quota.RateUse{}}, gate: make(chan struct{})}
	now := time.Unix(1_800_000_000, 0)
	r := quota.NewTenantRates(st, func() time.Time { return now }, time.Minute)
	limit := quota.Rate{Requests: 305} // a share: 5 calls; a burst: 50
	const calls = 30
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			if h, _, err := r.Take(ctx, "acme", limit, 0); err != nil || h == nil {
				t.Errorf("take: %v, %v", h, err)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // the calls gather behind the first lease
	close(st.gate)
	wg.Wait()
	if len(st.wants) > 2 {
		t.Errorf("leases wanting %v calls, want at most two: the first call's, then one for all the others", st.wants)
	}
	now = now.Add(quota.RateBurst * time.Second)
	if h, _, err := r.Take(ctx, "acme", limit, 0); err != nil || h == nil {
		t.Fatalf("take alone: %v, %v", h, err)
	}
	if got := st.wants[len(st.wants)-1]; got != 5 {
		t.Errorf("a call alone leased %d calls, want a share's 5", got)
	}
}

// countingRates is memRates whose leases record what they wanted, the first waiting for gate.
type countingRates struct {
	memRates
	gate  chan struct{}
	wants []int64
}

func (c *countingRates) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	<-c.gate // a TenantRates leases one at a time: no lock needed
	c.wants = append(c.wants, l.Want.Requests)
	return c.memRates.LeaseRate(ctx, l)
}

// A refused call whose room opens within a burst waits in process for it — pause before, resume
// after —, at most as many at once as a lease can grant; the others are sent back at the limit's
// pace. A wait resume calls off, or whose context ends, ends the take.
func TestTenantRatesTakeOrWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		r := quota.NewTenantRates(&memRates{slots: map[int64]quota.RateUse{}}, time.Now, time.Minute)
		limit := quota.Rate{Requests: 61} // a share: 1 call; a burst: RateBurst calls
		for range quota.RateBurst {
			if h, _, err := r.Take(ctx, "acme", limit, 0); err != nil || h == nil {
				t.Fatalf("take with room: %v, %v", h, err)
			}
		}
		start := time.Now()
		room := start.Truncate(time.Second).Add(quota.RateBurst * time.Second) // the burst's first slot leaves it
		type outcome struct {
			hold     *quota.RateHold
			at, when time.Time
			paused   bool
		}
		out := make(chan outcome, quota.RateBurst+2)
		for range quota.RateBurst + 2 {
			go func() {
				var o outcome
				var err error
				o.hold, o.at, err = r.TakeOrWait(ctx, "acme", limit, 0, func() { o.paused = true }, func() bool { return true })
				if err != nil {
					t.Error(err)
				}
				o.when = time.Now()
				out <- o
			}()
		}
		var waited, sent int
		for range quota.RateBurst + 2 {
			switch o := <-out; {
			case o.hold != nil && o.paused && !o.when.Before(room) && !o.hold.Late():
				waited++
			case o.hold == nil && !o.paused && o.when.Equal(start) && !o.at.Before(room):
				sent++
			default:
				t.Errorf("a refused call: hold %v, paused %v, done after %v, back at %v", o.hold != nil, o.paused, o.when.Sub(start), o.at.Sub(start))
			}
		}
		if waited != quota.RateBurst || sent != 2 {
			t.Errorf("%d calls waited for room and %d were sent back, want %d and 2", waited, sent, quota.RateBurst)
		}

		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, _, err := r.TakeOrWait(cancelled, "acme", limit, 0, func() {}, func() bool { return true }); !errors.Is(err, context.Canceled) {
			t.Errorf("a wait whose context ended: %v, want context.Canceled", err)
		}
		if _, _, err := r.TakeOrWait(ctx, "acme", limit, 0, func() {}, func() bool { return false }); !errors.Is(err, quota.ErrRateWaitOff) {
			t.Errorf("a wait resume called off: %v, want ErrRateWaitOff", err)
		}
	})
}

// Wait holds a call back until its tenant has room — here a minute later, when the first call
// leaves the window — or until its context ends.
func TestTenantRatesWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		r := quota.NewTenantRates(&memRates{slots: map[int64]quota.RateUse{}}, time.Now, time.Minute)
		limit := quota.Rate{Requests: 1}
		if h, err := r.Wait(ctx, "acme", limit, 0); err != nil || h == nil {
			t.Fatalf("first wait: %v, %v", h, err)
		}
		start := time.Now()
		room := start.Truncate(time.Second).Add((quota.RateSlots + 1) * time.Second)
		if h, err := r.Wait(ctx, "acme", limit, 0); err != nil || h == nil {
			t.Fatalf("second wait: %v, %v", h, err)
		}
		if got := time.Now(); got.Before(room) {
			t.Errorf("the second call went at %v, before its window had room at %v", got.Sub(start), room.Sub(start))
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := r.Wait(cancelled, "acme", limit, 0); !errors.Is(err, context.Canceled) {
			t.Errorf("wait with its context ended: %v, want context.Canceled", err)
		}
	})
}

// slowRates is memRates whose leases answer after the clock has moved on by late.
type slowRates struct {
	memRates
	now  *time.Time
	late time.Duration
}

func (s *slowRates) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	g, err := s.memRates.LeaseRate(ctx, l)
	*s.now = s.now.Add(s.late)
	return g, err
}

// A lease that answers after its slot has ended granted room in that slot, not in the one the
// call is made in: the call is taken from a lease of the slot it is made in, and the stale
// grant is given back, so the store counts every call in the slot it was made in.
func TestTenantRatesLeaseAnsweringLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0).Add(900 * time.Millisecond)
	st := &slowRates{memRates: memRates{slots: map[int64]quota.RateUse{}}, now: &now, late: 200 * time.Millisecond}
	r := quota.NewTenantRates(st, func() time.Time { return now }, time.Minute)
	limit := quota.Rate{Requests: 61}
	hold, _, err := r.Take(ctx, "acme", limit, 0)
	if err != nil || hold == nil {
		t.Fatalf("take: %v, %v", hold, err)
	}
	hold.Settle(1, 0)
	made := now
	now = now.Add(time.Second) // the instance gives back what its slot left unused
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[int64]int64{}
	for slot, u := range st.slots {
		if u.Requests != 0 {
			got[slot] = u.Requests
		}
	}
	if want := map[int64]int64{1_800_000_001: 1}; !cmp.Equal(want, got) {
		t.Errorf("calls counted by slot %v, want %v: the call was made at %v", got, want, made)
	}
}
