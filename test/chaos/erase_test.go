package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// DELETE /v1/tasks/{id} removes the Files API copies their tasks left behind: every delete the
// worker tries when a task ends fails (the Files API refuses it, as a worker dying first would
// leave it), the copies outlive their tasks, and the tenant's DELETE — through the publisher,
// which holds no Gemini key — has a worker delete them, leaving no erased task with a copy.
func TestEraseDeletesLeftoverFileCopies(t *testing.T) {
	t.Parallel()
	s := newStack(t, geminitest.Fixed(100*time.Millisecond), "")
	gcs := s.withStorage()
	n := scale(3, 10)
	s.fake.FailFileDeletes(n)
	s.start()
	tasks := s.submitFiles(gcs, n, "erase")
	s.checkInvariants(scale(90*time.Second, 5*time.Minute), 0)

	live := func() int {
		k := 0
		for _, f := range s.fake.Files() {
			if !f.Deleted {
				k++
			}
		}
		return k
	}
	// The worker's delete beside each task's end has run (and failed) once the fake counted it.
	time.Sleep(500 * time.Millisecond)
	if k := live(); k != n {
		t.Fatalf("%d copies live after their tasks ended with every delete refused, want %d", k, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	for _, sub := range tasks {
		if err := s.api.Delete(ctx, sub.id); err != nil {
			t.Fatalf("DELETE %s: %v", sub.id, err)
		}
	}
	for live() > 0 {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d copies still live 30 s after their tasks were erased", live(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d copies left behind, all deleted %s after the first DELETE", n, time.Since(start).Round(time.Millisecond))
	// The worker deletes a copy, then takes it off the task's list in a write of its own.
	for _, sub := range tasks {
		for {
			doc, err := s.store.GetTask(context.Background(), sub.id)
			if err != nil {
				t.Fatal(err)
			}
			if doc.FileErase == nil && doc.ErasedAt != nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("task %s 30 s after its erase: erased_at %v, file_erase %+v; want erased, nothing listed", sub.id, doc.ErasedAt, doc.FileErase)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
