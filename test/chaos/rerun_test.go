package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A re-run's pacer dies with its worker (SIGKILL) a third of the way through; the worker comes
// back as another instance — another lease owner, which must wait for the dead one's lease to
// expire — and carries the re-run to its end. Every task is re-run exactly once: one new replay
// each, its new outcome's webhook delivered, and one billed generation each, besides the calls
// in the worker's documented paid window at the kill: those it cut short (the fake bills them as
// abandoned) and those that had answered but whose outputs were not stored yet.
func TestRerunResumesAfterItsWorkerIsKilled(t *testing.T) {
	t.Parallel()
	n := scale(200, 500)
	s := newStack(t, geminitest.Fixed(20*time.Millisecond), "")
	w := s.procs[svcWorker]
	paced := []string{"GENBOX_RERUN_INTERVAL", "100ms", "GENBOX_RERUN_PAGE", "10"}
	w.configure(s.procEnv(append([]string{"GENBOX_INSTANCE_ID", "worker-1"}, paced...)...), true)
	s.start()
	subs := s.submit(n, "rerun")
	s.checkInvariants(scale(3*time.Minute, 10*time.Minute), 0)

	ctx, cancel := context.WithTimeout(context.Background(), scale(3*time.Minute, 10*time.Minute))
	defer cancel()
	before := s.fake.Ledger()
	rr, err := s.api.Rerun(ctx, task.RerunRequest{Filter: task.RerunFilter{Family: "summarize"}})
	if err != nil {
		t.Fatal(err)
	}
	if rr.Count != n {
		t.Fatalf("the re-run counts %d tasks, want %d", rr.Count, n)
	}
	docID := rerun.DocID("chaos", rr.RerunID)
	// paid is the worker's paid window at the kill; again, the tasks generated a second time
	// in it (their call answered, their output not stored when the worker died).
	var paid, again int
	// The worker is restarted as another instance: its pacer is another lease owner.
	w.configure(s.procEnv(append([]string{"GENBOX_INSTANCE_ID", "worker-2"}, paced...)...), true)
	for {
		r, err := s.store.GetRerun(ctx, docID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Progress.Started >= n/3 && s.fake.InFlight() == 0 {
			atKill := s.fake.Ledger()
			w.kill()
			// The calls that had answered but whose outputs were not yet stored were in the
			// worker's paid window: at most those the re-run had not yet counted done.
			paid = atKill.Total.Generations - before.Total.Generations - r.Progress.Done
			s.logf("worker killed with the re-run at %+v, lease %s epoch %d; %d answered calls not counted done", r.Progress, r.Lease.Owner, r.Lease.Epoch, paid)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the re-run never reached a third: %+v", r.Progress)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var done *task.Rerun
	for {
		if done, err = s.api.GetRerun(ctx, rr.RerunID); err != nil {
			t.Fatal(err)
		}
		if done.State == task.RerunCompleted || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if want := (task.RerunProgress{Matched: n, Started: n, Done: n}); done.Progress == nil || *done.Progress != want {
		t.Fatalf("the re-run ended %s at %+v, want completed at %+v", done.State, done.Progress, want)
	}
	r, err := s.store.GetRerun(ctx, docID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.fake.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	led := s.fake.Ledger()
	abandoned := led.Total.Abandoned - before.Total.Abandoned
	for _, sub := range subs {
		tk, err := s.store.GetTask(ctx, sub.id)
		if err != nil {
			t.Fatal(err)
		}
		if tk.Replay != 1 || tk.Rerun != docID || tk.State != task.StateSucceeded || len(tk.Previous) != 1 {
			t.Fatalf("task %s: replay %d, re-run %q, state %s, %d earlier outcomes; want one new replay of the re-run", sub.id, tk.Replay, tk.Rerun, tk.State, len(tk.Previous))
		}
		billed := 0
		for _, b := range led.BillsFor(sub.marker) {
			if !b.Abandoned {
				billed++
			}
		}
		switch billed {
		case 2:
		case 3:
			again++
		default:
			t.Errorf("task %s was billed %d times besides the abandoned calls, want 2: its first run and one re-run", sub.id, billed)
		}
		event := task.EventID(sub.id, task.EventSucceeded, 1)
		select {
		case <-s.recv.Delivered(event):
		case <-ctx.Done():
			t.Fatalf("task %s: the re-run's webhook %s never arrived", sub.id, event)
		}
	}
	generations := led.Total.Generations - before.Total.Generations
	s.logf("%d tasks re-run once each across a worker kill: %d generations (%d abandoned by the kill), lease now epoch %d, restarts %s",
		n, generations, abandoned, r.Lease.Epoch, s.restarts())
	if again > paid || generations != n+abandoned+again {
		t.Errorf("%d generations for the re-run of %d tasks with %d abandoned and %d generated again (%d in the paid window at the kill)",
			generations, n, abandoned, again, paid)
	}
}
