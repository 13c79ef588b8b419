package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A task whose tenant has used its rpm is handed back before any call, with no attempt counted
// and not_before when its tenant has room; a tenant without rpm or tpm runs as before.
func TestTenantRateHandsBackWithoutACall(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{RPM: 1})
	b.tenant(t, "tenant-b", store.Limits{})
	mp := b.modelPolicy(quota.BudgetWait)
	now := time.Now()
	mp.Rates = quota.NewTenantRates(b.store, func() time.Time { return now }, time.Minute)
	h := b.policyHandler(t, policy("w1"), mp)
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		b.task(t, id, func(d *protocol.Task) { d.Tenant = "tenant-" + id[:1] })
		h.Handle(context.Background(), msg(id))
	}
	type view struct {
		State    task.State
		Attempts int
		Waiting  bool
	}
	got := map[string]view{}
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		d := b.get(t, id)
		got[id] = view{State: d.State, Attempts: d.Attempts, Waiting: d.NotBefore != nil}
	}
	want := map[string]view{
		"a1": {State: task.StateSucceeded},
		"a2": {State: task.StateQueued, Waiting: true},
		"b1": {State: task.StateSucceeded},
		"b2": {State: task.StateSucceeded},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tasks (-want +got):\n%s", diff)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 3 {
		t.Errorf("%d model calls, want 3: none for the task handed back", calls)
	}
}

// grantLog is the store's RateStore, recording what each lease granted.
type grantLog struct {
	quota.RateStore
	mu      sync.Mutex
	granted []quota.RateUse
}

func (g *grantLog) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	gr, err := g.RateStore.LeaseRate(ctx, l)
	if err == nil && gr.Got != (quota.RateUse{}) {
		g.mu.Lock()
		g.granted = append(g.granted, gr.Got)
		g.mu.Unlock()
	}
	return gr, err
}

// A retry inside one generation is a model call too: it takes its own call from the tenant's
// rpm before it is made, waiting for room (one call a window, here of 0.61 s).
func TestTenantRateRetryTakesItsOwnCall(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{RPM: 1})
	mp := b.modelPolicy(quota.BudgetWait)
	leases := &grantLog{RateStore: b.store}
	mp.Rates = quota.NewTenantRates(leases, time.Now, (quota.RateSlots+1)*10*time.Millisecond)
	h := b.policyHandler(t, policy("w1"), mp)
	b.srv.FailNext("m", 503)
	b.task(t, "a1")
	h.Handle(context.Background(), msg("a1"))
	if got := b.get(t, "a1"); got.State != task.StateSucceeded || got.ModelCalls != 2 {
		t.Fatalf("task %s after %d model calls, want succeeded after 2", got.State, got.ModelCalls)
	}
	leases.mu.Lock()
	defer leases.mu.Unlock()
	if diff := cmp.Diff([]quota.RateUse{{Requests: 1}, {Requests: 1}}, leases.granted); diff != "" {
		t.Errorf("leases granted (-want +got):\n%s", diff)
	}
}
