package protocol

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

// randomTask draws a task document with every field DueAt and Finalize read set at random,
// timestamps scattered an hour around now.
func randomTask(r *rand.Rand, now time.Time) *Task {
	at := func() *time.Time {
		if r.IntN(3) == 0 {
			return nil
		}
		v := now.Add(time.Duration(r.Int64N(int64(2*time.Hour))) - time.Hour)
		return &v
	}
	lease := func() claim.Lease {
		var l claim.Lease
		if r.IntN(2) == 0 {
			l.Owner = "w"
			l.Epoch = r.Int64N(5)
			l.ExpiresAt = at()
		}
		return l
	}
	t := &Task{
		ID:        "t",
		State:     task.States[r.IntN(len(task.States))],
		CreatedAt: now.Add(-time.Duration(r.Int64N(int64(time.Hour)))),
		NotBefore: at(),
		Lease:     lease(),
		NudgeAt:   at(),
		Nudges:    r.IntN(4),
		RunBefore: at(),
	}
	if r.IntN(2) == 0 {
		t.PendingSince = at()
	}
	ds := []task.DeliveryState{"", task.DeliveryNone, task.DeliveryPending, task.DeliveryDelivered, task.DeliveryDead, task.DeliveryDiscarded}
	t.Delivery = Delivery{State: ds[r.IntN(len(ds))], NextAttemptAt: at(), Lease: lease()}
	for range r.IntN(3) {
		t.Notices = append(t.Notices, Notice{Stage: task.StageGeneration, NextAttemptAt: at(), Lease: lease()})
	}
	if r.IntN(3) == 0 {
		t.Decision = &Decision{At: now.Add(-time.Minute), NextAttemptAt: at()}
		if r.IntN(2) == 0 {
			t.Decision.Topics = []string{"gemini-tasks"}
		}
	}
	if r.IntN(3) == 0 {
		t.SlackUpdate = &Pending{NextAttemptAt: at()}
		if r.IntN(2) == 0 {
			t.SlackUpdate.Keys = []string{"k"}
		}
	}
	if r.IntN(3) == 0 {
		t.FileErase = &Pending{NextAttemptAt: at()}
		if r.IntN(2) == 0 {
			t.FileErase.Keys = []string{"files/gb-1"}
		}
	}
	if r.IntN(3) == 0 {
		t.OpenDeadLetters = []string{"t:generation:0:0"}
	}
	return t
}

// deadlines lists, straight from docs/architecture.md §0, the deadline of everything still pending on t.
func deadlines(t *Task, now time.Time) []time.Time {
	var out []time.Time
	orNow := func(p *time.Time) time.Time {
		if p != nil {
			return *p
		}
		return now
	}
	leased := func(l claim.Lease, next *time.Time) time.Time {
		if l.Live(now) {
			return *l.ExpiresAt
		}
		return orNow(next)
	}
	switch t.State {
	case task.StateScheduled, task.StateQueued, task.StateWaiting:
		if t.NotBefore != nil {
			out = append(out, *t.NotBefore)
		} else {
			out = append(out, t.CreatedAt)
		}
		if t.RunBefore != nil { // past it the task is failed as expired, whatever its backoff
			out = append(out, *t.RunBefore)
		}
	case task.StateRunning:
		out = append(out, orNow(t.Lease.ExpiresAt))
	}
	if t.Delivery.State == task.DeliveryPending {
		out = append(out, leased(t.Delivery.Lease, t.Delivery.NextAttemptAt))
	}
	for _, n := range t.Notices {
		out = append(out, leased(n.Lease, n.NextAttemptAt))
	}
	if t.Decision != nil && len(t.Decision.Topics) > 0 {
		if t.Decision.NextAttemptAt != nil {
			out = append(out, *t.Decision.NextAttemptAt)
		} else {
			out = append(out, t.Decision.At)
		}
	}
	if t.SlackUpdate != nil && len(t.SlackUpdate.Keys) > 0 {
		out = append(out, orNow(t.SlackUpdate.NextAttemptAt))
	}
	if t.FileErase != nil && len(t.FileErase.Keys) > 0 {
		out = append(out, orNow(t.FileErase.NextAttemptAt))
	}
	return out
}

func TestDueAtProperties(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 1))
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	for i := range 20000 {
		doc := randomTask(r, now)
		nudgeAt, pendingSince := doc.NudgeAt, doc.PendingSince
		want := deadlines(doc, now)
		due, ok := DueAt(doc, now)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d case %d (%+v): "+format, append([]any{seed, i, doc}, args...)...)
		}
		if ok != (len(want) > 0) {
			fail("ok = %v, pending deadlines %v", ok, want)
		}
		if ok && due.IsZero() {
			fail("due is the zero time")
		}
		if ok {
			earliest := want[0]
			for _, w := range want[1:] {
				if w.Before(earliest) {
					earliest = w
				}
			}
			exp := earliest
			if nudgeAt != nil && nudgeAt.After(exp) {
				exp = *nudgeAt
			}
			if !due.Equal(exp) {
				fail("due = %v, want %v (earliest %v, nudge_at %v)", due, exp, earliest, nudgeAt)
			}
			if nudgeAt != nil && due.Before(*nudgeAt) {
				fail("due %v before nudge_at %v", due, *nudgeAt)
			}
		}

		Finalize(doc, now, time.Hour, 1)
		switch {
		case !ok && doc.DueAt != nil:
			fail("due_at %v with nothing pending", *doc.DueAt)
		case ok && (doc.DueAt == nil || !doc.DueAt.Equal(due) || doc.DueAt.IsZero()):
			fail("due_at = %v, want %v", doc.DueAt, due)
		case ok && doc.PendingSince == nil:
			fail("pending without pending_since")
		case ok && pendingSince != nil && !doc.PendingSince.Equal(*pendingSince):
			fail("pending_since moved from %v to %v while still pending", *pendingSince, *doc.PendingSince)
		case !ok && (doc.PendingSince != nil || doc.NudgeAt != nil || doc.Nudges != 0):
			fail("nothing pending but pending_since/nudges kept")
		}
		wantExpire := !ok && len(doc.OpenDeadLetters) == 0 && doc.State.Finished() && doc.State != task.StateDead
		if (doc.ExpireAt != nil) != wantExpire {
			fail("expire_at = %v, want set %v", doc.ExpireAt, wantExpire)
		}
		if doc.ExpireAt != nil && !doc.ExpireAt.Equal(now.Add(time.Hour)) {
			fail("expire_at = %v, want now+retention", *doc.ExpireAt)
		}
	}
}

// A task backed off past its run_before is due at run_before, when it is failed as expired,
// not when its backoff ends: a task parked through an outage does not stay waiting past it.
func TestDueAtHonoursRunBefore(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	nb, rb := now.Add(time.Hour), now.Add(5*time.Minute)
	for _, state := range []task.State{task.StateScheduled, task.StateQueued, task.StateWaiting} {
		doc := &Task{State: state, CreatedAt: now, NotBefore: &nb, RunBefore: &rb}
		if due, ok := DueAt(doc, now); !ok || !due.Equal(rb) {
			t.Errorf("%s, not_before in 1h, run_before in 5m: due %v (%v), want %v", state, due, ok, rb)
		}
	}
}

// A finished task with a delivery in flight is pending (never expires); once the delivery ends
// the task expires after the retention, unless a dead letter is still open.
func TestFinalizeExpiry(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		doc        Task
		wantDue    bool
		wantExpire bool
	}{
		{"queued", Task{State: task.StateQueued, CreatedAt: now}, true, false},
		{"scheduled", Task{State: task.StateScheduled, CreatedAt: now, NotBefore: new(now.Add(time.Hour))}, true, false},
		{"succeeded, delivery pending", Task{State: task.StateSucceeded, Delivery: Delivery{State: task.DeliveryPending}}, true, false},
		{"succeeded, delivered", Task{State: task.StateSucceeded, Delivery: Delivery{State: task.DeliveryDelivered}}, false, true},
		{"failed, dead letter open", Task{State: task.StateFailed, OpenDeadLetters: []string{"x"}}, false, false},
		{"dead", Task{State: task.StateDead}, false, false},
		{"dead with notice", Task{State: task.StateDead, Notices: []Notice{{Stage: task.StageGeneration}}}, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc := tc.doc
			Finalize(&doc, now, time.Hour, 1)
			if (doc.DueAt != nil) != tc.wantDue || (doc.ExpireAt != nil) != tc.wantExpire {
				t.Fatalf("due_at %v expire_at %v; want due %v expire %v", doc.DueAt, doc.ExpireAt, tc.wantDue, tc.wantExpire)
			}
		})
	}
}

// A task keeps its shard across writes (the shard is a function of its id), every shard is in
// range, and the ids of a burst spread over the shards evenly enough that no shard's range takes
// much more than its share of the writes.
func TestShardSpreadsIDs(t *testing.T) {
	t.Parallel()
	const shards, ids = 8, 8000
	counts := make([]int, shards)
	for i := range ids {
		id := fmt.Sprintf("task-%d", i)
		k := Shard(id, shards)
		if k < 0 || k >= shards {
			t.Fatalf("Shard(%q, %d) = %d, out of range", id, shards, k)
		}
		if again := Shard(id, shards); again != k {
			t.Fatalf("Shard(%q) is %d, then %d", id, k, again)
		}
		counts[k]++
	}
	for k, n := range counts {
		if n < ids/shards*8/10 || n > ids/shards*12/10 {
			t.Errorf("shard %d holds %d of %d ids, want within 20%% of %d: %v", k, n, ids, ids/shards, counts)
		}
	}
	for _, n := range []int{0, 1} {
		if k := Shard("x", n); k != 0 {
			t.Errorf("Shard with %d shards = %d, want 0: fewer than two is one shard", n, k)
		}
	}
}

// A scheduled task is due at its start time, however long before it was written: the sweeper
// finds it then, and not before; and it is pending only from then on.
func TestDueAtOfAScheduledTaskIsItsStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	start := now.Add(29 * 24 * time.Hour)
	doc := &Task{State: task.StateScheduled, CreatedAt: now, StartAfter: &start, NotBefore: &start}
	if due, ok := DueAt(doc, now); !ok || !due.Equal(start) {
		t.Fatalf("scheduled to start in 29 days: due %v (%v), want %v", due, ok, start)
	}
	// Its work is pending from its start: the age alerts (now - pending_since) do not count
	// the wait it asked for.
	Finalize(doc, now, time.Hour, 1)
	if doc.PendingSince == nil || !doc.PendingSince.Equal(start) {
		t.Fatalf("pending_since %v, want its start %v", doc.PendingSince, start)
	}
}
