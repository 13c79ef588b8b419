package worker

import (
	"context"
	"testing"
	"time"

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
	b.tenant(t, "tenant-a", store.Limits{RPM: 2})
	b.tenant(t, "tenant-b", store.Limits{})
	mp := b.modelPolicy(quota.BudgetWait)
	now := time.Now()
	mp.Rates = quota.NewTenantRates(b.store, func() time.Time { return now }, time.Minute) // one slot: room for one call
	h := b.policyHandler(t, policy("w1"), mp)
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		b.task(t, id, func(d *store.Task) { d.Tenant = "tenant-" + id[:1] })
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

// A retry inside one generation is a model call too: it takes its own call from the tenant's
// rpm before it is made, waiting for room (here the next slot: one call a slot), so the
// tenant's window counts both calls, each in the slot it was made in.
func TestTenantRateRetryTakesItsOwnCall(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{RPM: 2})
	mp := b.modelPolicy(quota.BudgetWait)
	mp.Rates = quota.NewTenantRates(b.store, time.Now, time.Minute)
	h := b.policyHandler(t, policy("w1"), mp)
	b.srv.FailNext("m", 503)
	b.task(t, "a1")
	h.Handle(context.Background(), msg("a1"))
	if got := b.get(t, "a1"); got.State != task.StateSucceeded || got.ModelCalls != 2 {
		t.Fatalf("task %s after %d model calls, want succeeded after 2", got.State, got.ModelCalls)
	}
	snap, err := b.store.FS.Collection(store.TenantRatesCollection).Doc("tenant-a").Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slots, _ := snap.Data()["slots"].(map[string]any)
	var requests []int64
	for _, s := range slots {
		n, _ := s.(map[string]any)["requests"].(int64)
		requests = append(requests, n)
	}
	if diff := cmp.Diff([]int64{1, 1}, requests); diff != "" {
		t.Errorf("requests per slot of the tenant's window (-want +got):\n%s", diff)
	}
}
