package quota_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/quota"
)

func TestRateLeaseGrant(t *testing.T) {
	t.Parallel()
	window := func(last quota.RateUse, before ...quota.RateUse) []quota.RateUse {
		w := make([]quota.RateUse, quota.RateSlots+1)
		copy(w, before)
		w[quota.RateSlots] = last
		return w
	}
	tests := []struct {
		name   string
		lease  quota.RateLease
		window []quota.RateUse
		want   quota.RateUse
	}{
		{"an empty window grants the slot's share", quota.RateLease{Limit: quota.Rate{Requests: 122}, Need: quota.RateUse{Requests: 1}, Want: quota.RateUse{Requests: 122}},
			window(quota.RateUse{}), quota.RateUse{Requests: 2}},
		{"the slot's share taken, nothing", quota.RateLease{Limit: quota.Rate{Requests: 122}, Need: quota.RateUse{Requests: 1}, Want: quota.RateUse{Requests: 122}},
			window(quota.RateUse{Requests: 2}), quota.RateUse{}},
		{"a full window, nothing", quota.RateLease{Limit: quota.Rate{Requests: 122}, Need: quota.RateUse{Requests: 1}, Want: quota.RateUse{Requests: 122}},
			window(quota.RateUse{}, quota.RateUse{Requests: 122}), quota.RateUse{}},
		{"what the window has left", quota.RateLease{Limit: quota.Rate{Requests: 122}, Need: quota.RateUse{Requests: 1}, Want: quota.RateUse{Requests: 122}},
			window(quota.RateUse{}, quota.RateUse{Requests: 121}), quota.RateUse{Requests: 1}},
		{"one call may pass the share by its need less one", quota.RateLease{Limit: quota.Rate{Tokens: 6100}, Need: quota.RateUse{Tokens: 500}, Want: quota.RateUse{Tokens: 6100}},
			window(quota.RateUse{}), quota.RateUse{Tokens: 599}},
		{"a part without a limit is not counted", quota.RateLease{Limit: quota.Rate{Tokens: 6100}, Need: quota.RateUse{Requests: 1, Tokens: 50}, Want: quota.RateUse{Requests: 5, Tokens: 6100}},
			window(quota.RateUse{Requests: 1000}), quota.RateUse{Tokens: 149}},
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
	limit := quota.Rate{Requests: 61, Tokens: 61_000}

	hold, _, err := r.Take(ctx, "acme", limit, 500)
	if err != nil || hold == nil {
		t.Fatalf("first take: %v, %v", hold, err)
	}
	hold.Settle(1, 100) // 400 tokens back: the slot's share (1 call) is spent all the same
	var refused []time.Time
	for range 3 {
		h, at, err := r.Take(ctx, "acme", limit, 500)
		if err != nil || h != nil {
			t.Fatalf("take beyond the slot's share: %v, %v", h, err)
		}
		refused = append(refused, at)
	}
	pace := (time.Minute + time.Second) / 61
	want := []time.Time{now.Add(time.Second), now.Add(time.Second + pace), now.Add(time.Second + 2*pace)}
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("refused calls come back at (-want +got):\n%s", diff)
	}
	if st.leases != 1 {
		t.Errorf("%d leases, want 1: the lease took the slot's share, so refusals in the slot cost none", st.leases)
	}

	now = now.Add(time.Second)
	hold, _, err = r.Take(ctx, "acme", limit, 500)
	if err != nil || hold == nil {
		t.Fatalf("take in the next slot: %v, %v", hold, err)
	}
	hold.Settle(1, 100)
	if got := st.slots[1_800_000_000]; got != (quota.RateUse{Requests: 1, Tokens: 100}) {
		t.Errorf("the first slot holds %+v after its unused share was given back, want 1 call and 100 tokens", got)
	}

	if _, _, err := r.Take(ctx, "acme", limit, 70_000); !errors.Is(err, quota.ErrRateTooLarge) {
		t.Errorf("a call above the whole tpm: %v, want ErrRateTooLarge", err)
	}
	if h, at, err := r.Take(ctx, "other", quota.Rate{}, 1_000_000); h != nil || !at.IsZero() || err != nil {
		t.Errorf("a tenant without limits: %v, %v, %v; want no hold", h, at, err)
	}
}

// Wait holds a call back until its tenant has room — here the next slot, the first's share
// spent — or until its context ends.
func TestTenantRatesWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		r := quota.NewTenantRates(&memRates{slots: map[int64]quota.RateUse{}}, time.Now, time.Minute)
		limit := quota.Rate{Requests: 61}
		if h, err := r.Wait(ctx, "acme", limit, 0); err != nil || h == nil {
			t.Fatalf("first wait: %v, %v", h, err)
		}
		start := time.Now()
		next := start.Truncate(time.Second).Add(time.Second)
		if h, err := r.Wait(ctx, "acme", limit, 0); err != nil || h == nil {
			t.Fatalf("second wait: %v, %v", h, err)
		}
		if got := time.Now(); got.Before(next) {
			t.Errorf("the second call went at %v, before the next slot at %v", got.Sub(start), next.Sub(start))
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := r.Wait(cancelled, "acme", limit, 0); !errors.Is(err, context.Canceled) {
			t.Errorf("wait with its context ended: %v, want context.Canceled", err)
		}
	})
}
