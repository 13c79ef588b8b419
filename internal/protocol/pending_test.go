package protocol

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

var (
	atNow      = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	aMinuteAgo = atNow.Add(-time.Minute)
	inAMinute  = atNow.Add(time.Minute)
)

func leaseUntil(owner string, epoch int64, expires time.Time) claim.Lease {
	return claim.Lease{Owner: owner, Epoch: epoch, ExpiresAt: &expires}
}

// The rule the sweeper nudges a task by and the worker claims it by.
func TestTaskDue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		task Task
		want bool
	}{
		{"queued without a backoff", Task{State: task.StateQueued, CreatedAt: aMinuteAgo}, true},
		{"queued within its backoff", Task{State: task.StateQueued, NotBefore: &inAMinute}, false},
		{"queued at the end of its backoff", Task{State: task.StateQueued, NotBefore: &atNow}, true},
		{"queued past its backoff", Task{State: task.StateQueued, NotBefore: &aMinuteAgo}, true},
		{"queued within its backoff past run_before", Task{State: task.StateQueued, NotBefore: &inAMinute, RunBefore: &atNow}, true},
		{"queued within its backoff before run_before", Task{State: task.StateQueued, NotBefore: &inAMinute, RunBefore: &inAMinute}, false},
		{"scheduled before its start", Task{State: task.StateScheduled, NotBefore: &inAMinute}, false},
		{"scheduled at its start", Task{State: task.StateScheduled, NotBefore: &atNow}, true},
		{"parked", Task{State: task.StateWaiting, NotBefore: &inAMinute}, false},
		{"parked past run_before", Task{State: task.StateWaiting, NotBefore: &inAMinute, RunBefore: &aMinuteAgo}, true},
		{"running under a live lease", Task{State: task.StateRunning, Lease: leaseUntil("w", 1, inAMinute)}, false},
		{"running under an expired lease", Task{State: task.StateRunning, Lease: leaseUntil("w", 1, atNow)}, true},
		{"running without a lease", Task{State: task.StateRunning}, true},
		{"succeeded", Task{State: task.StateSucceeded}, false},
		{"failed past run_before", Task{State: task.StateFailed, RunBefore: &aMinuteAgo}, false},
		{"cancelled", Task{State: task.StateCancelled}, false},
	} {
		if got := TaskDue(&tc.task, atNow); got != tc.want {
			t.Errorf("%s: TaskDue = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The rule the sweeper nudges a delivery by, a commit reserves it by and the resulthandler
// claims it by.
func TestDeliveryClaimable(t *testing.T) {
	t.Parallel()
	pending := func(l claim.Lease, next *time.Time) Delivery {
		return Delivery{State: task.DeliveryPending, Lease: l, NextAttemptAt: next}
	}
	for _, tc := range []struct {
		name     string
		d        Delivery
		reserved int64
		want     bool
	}{
		{"no delivery", Delivery{}, 0, false},
		{"delivered", Delivery{State: task.DeliveryDelivered}, 0, false},
		{"dead", Delivery{State: task.DeliveryDead}, 0, false},
		{"pending, never tried", pending(claim.Lease{}, nil), 0, true},
		{"pending within its retry backoff", pending(claim.Lease{}, &inAMinute), 0, false},
		{"pending at the end of its retry backoff", pending(claim.Lease{}, &atNow), 0, true},
		{"held by a live lease", pending(leaseUntil("rh", 2, inAMinute), nil), 0, false},
		{"held by an expired lease", pending(leaseUntil("rh", 2, atNow), nil), 0, true},
		{"reserved, claimed by another", pending(leaseUntil(NudgeOwner, 3, inAMinute), nil), 0, false},
		{"reserved, claimed by the reservation's nudge", pending(leaseUntil(NudgeOwner, 3, inAMinute), nil), 3, true},
		{"reserved, claimed by a stale nudge", pending(leaseUntil(NudgeOwner, 3, inAMinute), nil), 2, false},
		{"reserved within a retry backoff", pending(leaseUntil(NudgeOwner, 3, inAMinute), &inAMinute), 3, false},
		{"held by a claimer at the nudge's epoch", pending(leaseUntil("rh", 3, inAMinute), nil), 3, false},
		{"a lapsed reservation", pending(leaseUntil(NudgeOwner, 3, aMinuteAgo), nil), 3, true},
	} {
		if got := tc.d.Claimable(atNow, tc.reserved); got != tc.want {
			t.Errorf("%s: Claimable(reserved %d) = %v, want %v", tc.name, tc.reserved, got, tc.want)
		}
	}
}

// The rules of the sweeper's other nudges: a DLQ notice, a decision's topics, a Slack update.
func TestFollowUpsDue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"notice never tried", Notice{}.Due(atNow), true},
		{"notice within its backoff", Notice{NextAttemptAt: &inAMinute}.Due(atNow), false},
		{"notice past its backoff", Notice{NextAttemptAt: &aMinuteAgo}.Due(atNow), true},
		{"notice held", Notice{Lease: leaseUntil("dlq", 1, inAMinute)}.Due(atNow), false},
		{"notice under an expired lease", Notice{Lease: leaseUntil("dlq", 1, aMinuteAgo), NextAttemptAt: &aMinuteAgo}.Due(atNow), true},
		{"no decision", (*Decision)(nil).Due(atNow), false},
		{"a decision carried out", (&Decision{At: aMinuteAgo}).Due(atNow), false},
		{"a decision's nudges", (&Decision{At: aMinuteAgo, Topics: []string{"gemini-tasks"}}).Due(atNow), true},
		{"a decision's nudges in their backoff", (&Decision{At: aMinuteAgo, Topics: []string{"gemini-tasks"}, NextAttemptAt: &inAMinute}).Due(atNow), false},
		{"no Slack update", (*Pending)(nil).Due(atNow), false},
		{"a Slack update done", (&Pending{}).Due(atNow), false},
		{"a Slack update", (&Pending{Keys: []string{"k"}}).Due(atNow), true},
		{"a Slack update in its backoff", (&Pending{Keys: []string{"k"}, NextAttemptAt: &inAMinute}).Due(atNow), false},
		{"a Slack update past its backoff", (&Pending{Keys: []string{"k"}, NextAttemptAt: &atNow}).Due(atNow), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: Due = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// Each part's due_at and its "due now" are one rule: a part is due at now exactly when its part
// of due_at has come, so the sweeper finds (due_at <= now) what it then nudges.
func TestDueAgreesWithDueAt(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 2))
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	for i := range 20000 {
		doc := randomTask(r, now)
		parts := needs(doc, now)
		anyDue := false
		for k, n := range parts {
			if n.due != !now.Before(n.at) {
				t.Fatalf("seed %d case %d part %d (%+v): due %v but at %v", seed, i, k, doc, n.due, n.at)
			}
			anyDue = anyDue || n.due
		}
		doc.NudgeAt = nil
		if due, ok := DueAt(doc, now); anyDue != (ok && !now.Before(due)) {
			t.Fatalf("seed %d case %d (%+v): a part due %v, due_at %v (pending %v)", seed, i, doc, anyDue, due, ok)
		}
	}
}
