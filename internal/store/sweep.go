package store

import (
	"context"
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/task"
)

// sweepFields lists the only fields a sweep reads (Select): what is due (pending.go), and what
// Finalize needs to recompute due_at, pending_since and expire_at after the nudge.
var sweepFields = []string{
	"state", "created_at", "not_before", "run_before", "lease", "model_chain", "parks", "error", "nudges",
	"nudge_at", "due_at", "pending_since", "open_dead_letters",
	"delivery.state", "delivery.next_attempt_at", "delivery.lease",
	"dlq_notices", "decision", "slack_update", "file_erase", "due_shard",
}

// DueTasks is the sweep of the task documents due at now, oldest due first, reading only what
// the sweeper needs: those of shard k ("sweep" in Queries), or with k < 0 every one ("sweep-strays").
func (s *Store) DueTasks(k int, now time.Time) firestore.Query {
	q := s.Tasks().Query
	if k >= 0 {
		q = q.Where("due_shard", "==", k)
	}
	return q.Where("due_at", "<=", now).OrderBy("due_at", firestore.Asc).Select(sweepFields...)
}

// ParkedTasks is the query of the waiting (parked) tasks ("parked"), reading what DueTasks reads.
func (s *Store) ParkedTasks() firestore.Query {
	return s.Tasks().Where("state", "==", string(task.StateWaiting)).Select(sweepFields...)
}

// InShard reports whether snap's due_shard names one of shards; a document written before there
// were shards has none.
func InShard(snap *firestore.DocumentSnapshot, shards int) bool {
	v, err := snap.DataAt("due_shard")
	k, ok := v.(int64)
	return err == nil && ok && k >= 0 && k < int64(shards)
}

// RecordNudge writes what a sweeper's nudge changed on t — nudges and nudge_at, with decided the
// decision's topics cleared (its nudges are out), with released the not_before of a parked task
// cleared — and what Finalize derives from them, among shards sweep shards. It is conditioned on
// t.UpdateTime: a document someone wrote since is left as they wrote it (their write reset the
// backoff and recomputed due_at), and ErrChanged is returned.
func (s *Store) RecordNudge(ctx context.Context, t *protocol.Task, now time.Time, shards int, decided, released bool) error {
	var updates []firestore.Update
	if decided {
		t.Decision.Topics = nil
		updates = append(updates, firestore.Update{Path: "decision.topics", Value: firestore.Delete})
	}
	if released {
		t.NotBefore = nil
		updates = append(updates, firestore.Update{Path: "not_before", Value: firestore.Delete})
	}
	protocol.Finalize(t, now, s.Retention, shards)
	updates = append(updates,
		firestore.Update{Path: "nudges", Value: t.Nudges},
		firestore.Update{Path: "nudge_at", Value: orDelete(t.NudgeAt)},
		firestore.Update{Path: "due_at", Value: orDelete(t.DueAt)},
		firestore.Update{Path: "due_shard", Value: t.DueShard},
		firestore.Update{Path: "pending_since", Value: orDelete(t.PendingSince)},
		firestore.Update{Path: "expire_at", Value: orDelete(t.ExpireAt)},
	)
	if err := updateUnchanged(ctx, s.Tasks().Doc(t.ID), updates, t.UpdateTime); err != nil {
		return fmt.Errorf("record nudge of %s: %w", t.ID, err)
	}
	return nil
}

// updateUnchanged applies updates to ref only if the document is unchanged since its update time
// as read: ErrChanged when it changed or is gone.
func updateUnchanged(ctx context.Context, ref *firestore.DocumentRef, updates []firestore.Update, since time.Time) error {
	_, err := ref.Update(ctx, updates, firestore.LastUpdateTime(since))
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.FailedPrecondition, codes.NotFound:
		return ErrChanged
	}
	return err
}

// orDelete is the value of an update of an optional time: the time, or the field deleted.
func orDelete(v *time.Time) any {
	if v == nil {
		return firestore.Delete
	}
	return *v
}
