package devstack

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Delayed tasks through the whole stack on the emulators. Each starts no sooner than its
// start_after — its model call reached the fake Gemini, and was recorded in its attempt log, at
// or after the start_after the API shows — and within the bound of docs/liveness.md:
// start_after + GENBOX_SWEEP_INTERVAL + N / GENBOX_SWEEP_PACE + ε, the pass's and the claim's
// own Firestore round trips, allowed roundTrips here: the emulators are shared with the other
// tests of the run. One cancelled before its start is never called: no model call, cost 0.
func TestDelayedTasksStartWithinTheBound(t *testing.T) {
	t.Parallel()
	const (
		interval   = time.Second
		pace       = 200 // GENBOX_SWEEP_PACE's default
		roundTrips = time.Second
		delay      = 3 * time.Second
	)
	s, _ := setup(t, "GENBOX_SWEEP_INTERVAL", interval.String(), "GENBOX_SWEEP_LEADER_TTL", (3 * interval).String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.New(s.Info.Publisher, s.Info.APIKey)
	marker := func(i int) string { return fmt.Sprintf("delayed-%d-%s", i, s.Info.Project) }
	start := time.Now().Add(delay)
	var reqs []task.Request
	for i := range 6 {
		r := task.Request{Family: "summarize", Input: "The " + marker(i) + " says the fox jumped."}
		if i%2 == 0 {
			r.StartAfter = &start
		} else {
			r.Delay = delay.String()
		}
		reqs = append(reqs, r)
	}
	res, err := c.SubmitBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Results {
		if r.State != task.StateScheduled {
			t.Fatalf("item %d: %+v, want scheduled", i, r)
		}
	}
	cancelled := len(reqs) - 1
	if v, err := c.Cancel(ctx, res.Results[cancelled].TaskID); err != nil || v.State != task.StateCancelled {
		t.Fatalf("cancel before the start: %+v %v", v, err)
	}
	n := cancelled // the documents due in the pass that finds them
	bound := interval + time.Duration(n)*time.Second/pace + roundTrips
	var latest time.Duration
	for i := range n {
		v, err := c.Wait(ctx, res.Results[i].TaskID, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if v.State != task.StateSucceeded || v.StartAfter == nil {
			t.Fatalf("task %d ended %s, start_after %v", i, v.State, v.StartAfter)
		}
		bills := s.Fake.Ledger().BillsFor(marker(i))
		if len(bills) != 1 {
			t.Fatalf("task %d billed %d times, want 1", i, len(bills))
		}
		doc, err := s.Store.GetTask(ctx, v.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		called, logged := bills[0].Started, doc.AttemptLog[0].At
		if called.Before(*v.StartAfter) || logged.Before(*v.StartAfter) {
			t.Fatalf("task %d started before its start_after %v: the model was called at %v, the attempt logged at %v",
				i, *v.StartAfter, called, logged)
		}
		lag := called.Sub(*v.StartAfter)
		if lag > bound {
			t.Errorf("task %d started %v after its start_after, beyond the bound %v", i, lag, bound)
		}
		latest = max(latest, lag)
	}
	t.Logf("%d delayed tasks started at most %v after their start_after (bound %v)", n, latest, bound)
	// The cancelled task's start has passed with the others'; the pass that started them would
	// have found it due.
	v, err := c.Get(ctx, res.Results[cancelled].TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if v.State != task.StateCancelled || v.CostUSD != 0 || v.Usage != (task.Usage{}) {
		t.Fatalf("the cancelled task: %s, cost %v, usage %+v; want cancelled, nothing spent", v.State, v.CostUSD, v.Usage)
	}
	if l := s.Fake.Ledger(); len(l.BillsFor(marker(cancelled))) != 0 || l.Total.Calls != n {
		t.Fatalf("the fake Gemini served %d calls, %d of them for the cancelled task; want %d and none",
			l.Total.Calls, len(l.BillsFor(marker(cancelled))), n)
	}
}
