package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A task write that names the tenant's slot count commits both, each conditioned on its read:
// a count changed since is not overwritten. TenantSlots shows each capped tenant's count, its
// tasks waiting for a slot and its cap.
func TestSlotCountCommitsWithTheTask(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	limits := store.DefaultLimits()
	limits.Concurrency = 3
	if _, err := s.CreateTenant(ctx, "acme", limits, "whsec_a"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"run", "w1", "w2"} {
		if err := s.CreateTask(ctx, &store.Task{ID: id, Tenant: "acme", State: task.StateQueued, AwaitsSlot: id != "run"}); err != nil {
			t.Fatal(err)
		}
	}
	take := func(c store.SlotCount) error {
		_, err := s.MutateTaskWith(ctx, &store.Task{ID: "run"}, func(t *store.Task, _ time.Time) ([]store.Write, error) {
			t.State, t.Slot = task.StateRunning, true
			return []store.Write{store.CountWrite(c, +1)}, nil
		})
		return err
	}
	stale, err := s.GetSlotCount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := take(stale); err != nil {
		t.Fatal(err)
	}
	if err := take(stale); err == nil {
		t.Fatal("a count write conditioned on a stale read was committed")
	}
	got, err := s.TenantSlots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.TenantSlotsView{{Tenant: "acme", Running: 1, Waiting: 2, Cap: 3}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("TenantSlots (-want +got):\n%s", diff)
	}
	if share := fmt.Sprintf("%.2f", got[0].Share()); share != "0.33" {
		t.Errorf("share %s, want 0.33", share)
	}
}
