package protocol

import (
	"hash/fnv"
	"time"

	"github.com/genbox-dev/genbox/pkg/task"
)

// DueAt is the one function that says when a task document next needs a nudge
// (docs/architecture.md §0): the earliest deadline among what is still pending — the task's own
// lease expiry, backoff, start time (a scheduled task's not_before) or run_before (past which it
// is failed as expired, backoff or not), the delivery in flight, each DLQ notice, a decision
// whose nudges are unpublished, a Slack update, the Files API copies of an erased task still to
// delete — floored by the sweeper's own backoff (nudge_at). ok is false when nothing is pending.
func DueAt(t *Task, now time.Time) (due time.Time, ok bool) {
	for _, n := range needs(t, now) {
		if !ok || n.at.Before(due) {
			due, ok = n.at, true
		}
	}
	if ok && t.NudgeAt != nil && t.NudgeAt.After(due) {
		due = *t.NudgeAt
	}
	return due, ok
}

// Finalize stores what DueAt derives, and the fields that follow from it: due_shard (Shard of the
// id among shards), pending_since (set when work becomes pending — a scheduled task's at its
// start —, cleared when none is) and
// expire_at (the TTL, set only when nothing is pending, no dead letter is open and the task has
// ended), and it bounds the task's error texts. Every writer calls it before writing.
func Finalize(t *Task, now time.Time, retention time.Duration, shards int) {
	t.boundText()
	t.DueShard = Shard(t.ID, shards)
	due, ok := DueAt(t, now)
	if !ok {
		t.DueAt, t.PendingSince, t.Nudges, t.NudgeAt = nil, nil, 0, nil
	} else {
		t.DueAt = &due
		if t.PendingSince == nil {
			since := now
			if t.State == task.StateScheduled && t.NotBefore != nil && t.NotBefore.After(now) {
				since = *t.NotBefore // waiting for its start is not work: the age alerts start there
			}
			t.PendingSince = &since
		}
	}
	t.ExpireAt = nil
	if !ok && len(t.OpenDeadLetters) == 0 && t.State.Finished() && t.State != task.StateDead {
		exp := now.Add(retention)
		t.ExpireAt = &exp
	}
}

// Shard is the sweep shard of task id among shards (docs/architecture.md §4, the sweeper): a hash
// of the id, so a task keeps its shard across writes and the tasks of a burst spread evenly over
// the shards' index ranges. Fewer than two shards is one, shard 0.
func Shard(id string, shards int) int {
	if shards < 2 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}

// MaxShards bounds GENBOX_SWEEP_SHARDS: every instance reads each shard's lease every sweep
// interval.
const MaxShards = 128
