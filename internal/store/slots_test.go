package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A task write that names the tenant's slot count commits both, each conditioned on its read:
// a count changed since is not overwritten. TenantSlots shows each capped tenant's count, its
// tasks waiting for a slot, its cap and weight, and its part of the slots held.
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
		if err := s.CreateTask(ctx, &protocol.Task{ID: id, Tenant: "acme", State: task.StateQueued, AwaitsSlot: id != "run"}); err != nil {
			t.Fatal(err)
		}
	}
	take := func(c store.SlotCount) error {
		_, err := s.MutateTaskWith(ctx, &protocol.Task{ID: "run"}, func(t *protocol.Task, _ time.Time) ([]store.Write, error) {
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
	// A second tenant, of weight 3, holds three slots: three quarters of those held.
	limits.Weight = 3
	if _, err := s.CreateTenant(ctx, "heavy", limits, "whsec_h"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTask(ctx, &protocol.Task{ID: "h", Tenant: "heavy", State: task.StateQueued}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MutateTaskWith(ctx, &protocol.Task{ID: "h"}, func(t *protocol.Task, _ time.Time) ([]store.Write, error) {
		t.State, t.Slot = task.StateRunning, true
		return []store.Write{store.CountWrite(store.SlotCount{Tenant: "heavy"}, +3)}, nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.TenantSlots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.TenantSlotsView{{Tenant: "acme", Running: 1, Waiting: 2, Cap: 3, Weight: 1, InUse: 0.25},
		{Tenant: "heavy", Running: 3, Cap: 3, Weight: 3, InUse: 0.75}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("TenantSlots (-want +got):\n%s", diff)
	}
	if share := fmt.Sprintf("%.2f", got[0].Share()); share != "0.33" {
		t.Errorf("share %s, want 0.33", share)
	}
}

// Every write that moves a slot holder out of running gives its slot back in the same commit,
// whoever makes it (a cancel, an operator's decision, not only the worker), and a task that is
// no longer queued no longer waits for a slot: the count cannot leak, and a finished task is
// never found among the waiting ones.
func TestEveryPathEndingARunFreesItsSlot(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	end := map[string]func(id string) error{
		"MutateTask": func(id string) error {
			_, err := s.MutateTask(ctx, id, func(t *protocol.Task, now time.Time) error {
				t.Finish(task.StateCancelled, now)
				return nil
			})
			return err
		},
		"MutateDeadLetter": func(id string) error {
			_, _, err := s.MutateDeadLetter(ctx, id, "dl-"+id, func(t *protocol.Task, _ *store.DeadLetter, now time.Time) error {
				t.Finish(task.StateDead, now)
				return nil
			})
			return err
		},
	}
	for name, end := range end {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tenant := "t-" + name
			for _, id := range []string{"holder-" + name, "waiter-" + name} {
				if err := s.CreateTask(ctx, &protocol.Task{ID: id, Tenant: tenant, State: task.StateQueued, AwaitsSlot: id == "waiter-"+name}); err != nil {
					t.Fatal(err)
				}
			}
			c, err := s.GetSlotCount(ctx, tenant)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.MutateTaskWith(ctx, &protocol.Task{ID: "holder-" + name}, func(t *protocol.Task, _ time.Time) ([]store.Write, error) {
				t.State, t.Slot = task.StateRunning, true
				return []store.Write{store.CountWrite(c, +1)}, nil
			}); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"holder-" + name, "waiter-" + name} {
				if err := end(id); err != nil {
					t.Fatal(err)
				}
				got, err := s.GetTask(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if got.Slot || got.AwaitsSlot {
					t.Errorf("%s ended %s with slot %v, awaits_slot %v; want neither", id, got.State, got.Slot, got.AwaitsSlot)
				}
			}
			after, err := s.GetSlotCount(ctx, tenant)
			if err != nil {
				t.Fatal(err)
			}
			if after.Running != 0 {
				t.Errorf("slot count %d after its holder ended, want 0", after.Running)
			}
		})
	}
}

// A burst of submissions of an idle capped tenant creates as many tasks queued as it has
// slots, and the rest waiting for one, though the worker has claimed none yet: each task
// created queued will take a slot, so the claims have no task to mark waiting. A task of a
// higher priority is created queued all the same, and a tenant without a cap never waits.
func TestSlotHintsCountTheTasksCreatedQueued(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	for tenant, cap := range map[string]int{"capped": 3, "free": 0} {
		limits := store.DefaultLimits()
		limits.Concurrency = cap
		if _, err := s.CreateTenant(ctx, tenant, limits, "whsec_a"); err != nil {
			t.Fatal(err)
		}
	}
	hints := store.NewSlotHints(s)
	now := time.Now()
	const waitMax = time.Minute
	submit := func(tenant string, priority int) string {
		tk := &protocol.Task{ID: "t", Tenant: tenant, State: task.StateQueued, Priority: priority}
		waits := hints.SubmitWaiting(ctx, tk, waitMax, now)
		switch {
		case waits != tk.AwaitsSlot:
			t.Fatalf("SubmitWaiting reported %v, task awaits_slot %v", waits, tk.AwaitsSlot)
		case !waits:
			return "queued"
		case tk.NotBefore == nil || !tk.NotBefore.Equal(now.Add(waitMax)):
			t.Fatalf("created waiting with not_before %v, want %v", tk.NotBefore, now.Add(waitMax))
		}
		return "waiting"
	}
	var got []string
	for range 5 {
		got = append(got, submit("capped", task.DefaultPriority))
	}
	got = append(got, submit("capped", task.MaxPriority), submit("free", task.DefaultPriority))
	want := []string{"queued", "queued", "queued", "waiting", "waiting", "queued", "queued"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("five tasks of a tenant capped at 3, one of the highest priority, one uncapped (-want +got):\n%s", diff)
	}
}
