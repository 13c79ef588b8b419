package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestPingOldestPendingAndOpenDeadLetters(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if _, ok, err := s.OldestPending(ctx); err != nil || ok {
		t.Fatalf("OldestPending on an empty store: ok %v, err %v", ok, err)
	}
	base := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for i, id := range []string{"later", "oldest", "done"} {
		now := base.Add(time.Duration(2-i) * time.Minute)
		tk := &protocol.Task{ID: id, Tenant: "t", Family: "f", State: task.StateQueued, CreatedAt: now}
		s.Now = func() time.Time { return now }
		if err := s.CreateTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	// "done" was created first but ended: it is no longer pending.
	if _, err := s.MutateTask(ctx, "done", func(tk *protocol.Task, now time.Time) error {
		tk.Finish(task.StateCancelled, now)
		tk.Delivery = protocol.Delivery{State: task.DeliveryNone}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	since, ok, err := s.OldestPending(ctx)
	if err != nil || !ok || !since.Equal(base.Add(time.Minute)) {
		t.Errorf("OldestPending = %v, %v, %v; want the pending_since of task oldest, %v", since, ok, err, base.Add(time.Minute))
	}

	for i, d := range []struct {
		stage task.Stage
		state store.DeadLetterState
	}{{task.StageGeneration, store.DeadLetterOpen}, {task.StageGeneration, store.DeadLetterOpen},
		{task.StageDelivery, store.DeadLetterOpen}, {task.StageDelivery, store.DeadLetterDiscarded}} {
		if _, err := s.DeadLetters().Doc(string(rune('a'+i))).Create(ctx, &store.DeadLetter{TaskID: "x", Stage: d.stage, State: d.state, CreatedAt: base}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.OpenDeadLetters(ctx)
	if err != nil || n[task.StageGeneration] != 2 || n[task.StageDelivery] != 1 {
		t.Errorf("OpenDeadLetters = %v, %v; want generation 2, delivery 1", n, err)
	}
}
