package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/task"
)

// MutateDeadLetter writes the task and its dead letter in one transaction: a dead letter fn
// leaves uncreated is not written, ErrNoChange writes nothing, a missing task is ErrNotFound, and
// an error from fn leaves both documents as they were.
func TestMutateDeadLetter(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if err := s.CreateTask(ctx, newTask("t1")); err != nil {
		t.Fatal(err)
	}
	const id = "t1:generation:0:0"
	if _, d, err := s.MutateDeadLetter(ctx, "t1", id, func(t *protocol.Task, d *store.DeadLetter, _ time.Time) error {
		t.Attempts = 1 // the task is written, the absent dead letter is not
		return nil
	}); err != nil || d.ID != id {
		t.Fatalf("%+v %v", d, err)
	}
	if _, err := s.GetDeadLetter(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an uncreated dead letter was written: %v", err)
	}
	tk, d, err := s.MutateDeadLetter(ctx, "t1", id, func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
		d.TaskID, d.Stage, d.State, d.CreatedAt = t.ID, task.StageGeneration, store.DeadLetterOpen, now
		t.OpenDeadLetters = append(t.OpenDeadLetters, d.ID)
		return nil
	})
	if err != nil || tk.Attempts != 1 || len(tk.OpenDeadLetters) != 1 || d.UpdatedAt.IsZero() {
		t.Fatalf("%+v %+v %v", tk, d, err)
	}
	got, err := s.GetDeadLetter(ctx, id)
	if err != nil || got.State != store.DeadLetterOpen || got.TaskID != "t1" {
		t.Fatalf("%+v %v", got, err)
	}
	boom := errors.New("boom")
	if _, _, err := s.MutateDeadLetter(ctx, "t1", id, func(t *protocol.Task, d *store.DeadLetter, _ time.Time) error {
		t.Attempts, d.State = 9, store.DeadLetterDiscarded
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if _, d, err := s.MutateDeadLetter(ctx, "t1", id, func(t *protocol.Task, d *store.DeadLetter, _ time.Time) error {
		d.State = store.DeadLetterDiscarded
		return store.ErrNoChange
	}); err != nil || d.State != store.DeadLetterOpen {
		t.Fatalf("ErrNoChange must return the dead letter as read: %+v %v", d, err)
	}
	if tk, _ := s.GetTask(ctx, "t1"); tk.Attempts != 1 {
		t.Fatalf("attempts %d", tk.Attempts)
	}
	if got, _ := s.GetDeadLetter(ctx, id); got.State != store.DeadLetterOpen {
		t.Fatalf("state %s", got.State)
	}
	if _, _, err := s.MutateDeadLetter(ctx, "none", "none:generation:0:0", func(*protocol.Task, *store.DeadLetter, time.Time) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing task: %v", err)
	}
}

// ListDeadLetters returns one state's dead letters, oldest first.
func TestListDeadLetters(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	base := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	for i, c := range []struct {
		id    string
		state store.DeadLetterState
	}{{"c", store.DeadLetterOpen}, {"a", store.DeadLetterOpen}, {"b", store.DeadLetterDiscarded}} {
		if err := s.CreateTask(ctx, newTask(c.id)); err != nil {
			t.Fatal(err)
		}
		s.Now = func() time.Time { return base.Add(time.Duration(i) * time.Minute) }
		if _, _, err := s.MutateDeadLetter(ctx, c.id, c.id+":delivery:0:0", func(t *protocol.Task, d *store.DeadLetter, now time.Time) error {
			d.TaskID, d.State, d.CreatedAt = t.ID, c.state, now
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	open, err := s.ListDeadLetters(ctx, store.DeadLetterOpen, 10)
	if err != nil || len(open) != 2 || open[0].TaskID != "c" || open[1].TaskID != "a" {
		t.Fatalf("%+v %v", open, err)
	}
	if one, _ := s.ListDeadLetters(ctx, store.DeadLetterOpen, 1); len(one) != 1 {
		t.Fatalf("limit: %d", len(one))
	}
}

// ClaimAlert lets one post through per key and cooldown; UnclaimAlert gives the key back.
func TestClaimAlert(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	s.Now = func() time.Time { return now }
	claim := func(key string) bool {
		t.Helper()
		ok, _, err := s.ClaimAlert(ctx, key, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim("k") || claim("k") || !claim("other") {
		t.Fatal("first claim of each key posts, a repeat does not")
	}
	now = now.Add(time.Minute)
	ok, prev, err := s.ClaimAlert(ctx, "k", time.Minute)
	if err != nil || !ok || !prev.Equal(now.Add(-time.Minute)) {
		t.Fatalf("after the cooldown: %v %v %v", ok, prev, err)
	}
	if err := s.UnclaimAlert(ctx, "k", prev); err != nil {
		t.Fatal(err)
	}
	if !claim("k") {
		t.Fatal("an unclaimed key must post again")
	}
}
