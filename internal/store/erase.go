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

// ErasedBy is who the dead letters that tenant's erase of a task discarded were decided by.
func ErasedBy(tenant string) string { return "tenant " + tenant + " (erase)" }

// EraseTask erases task id (Task.Erase) once check, given the task as read, accepts it (nil;
// an error refuses and writes nothing). In the same transaction it discards the open dead
// letters of the task's dead delivery, as their Discard does (DiscardDeadDelivery): a dead
// delivery bills nothing, and a flood of them is never paged task by task, so without this the
// tenant's data stayed until an operator decided. They are recorded as decided by
// ErasedBy(tenant), and their Slack messages are queued for an update. The task's Files API
// copies are queued for a worker to delete (QueueCopyErase). A task erased already is written
// again only for such a dead letter opened since. When the discard starts the delivery of the
// next queued event, or copies are queued, the sweeper keeps off them for grace: the caller
// nudges them first. It
// returns the task as written (or as read) and the ids of the dead letters discarded.
func (s *Store) EraseTask(ctx context.Context, id string, grace time.Duration, check func(t *protocol.Task) error) (*protocol.Task, []string, error) {
	ref := s.Tasks().Doc(id)
	var out *protocol.Task
	var discarded []string
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		out, discarded = nil, nil
		snap, err := tx.Get(ref)
		if status.Code(err) == codes.NotFound {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		now := s.now()
		t, changed, w, err := s.applySnap(snap, now, func(t *protocol.Task, now time.Time) error {
			if err := check(t); err != nil {
				return err
			}
			discarded = t.DiscardDeliveryDeadLetters(now)
			if len(discarded) == 0 && t.ErasedAt != nil {
				return ErrNoChange
			}
			if len(discarded) > 0 && t.Delivery.State == task.DeliveryPending {
				at := now.Add(grace)
				t.NudgeAt = &at
			}
			if t.ErasedAt == nil {
				t.Erase(now)
				t.QueueCopyErase(now.Add(grace))
			}
			return nil
		})
		if err != nil {
			return err
		}
		out = t
		if !changed {
			return nil
		}
		if w.freed {
			if err := s.freeSlotsTx(tx, []*protocol.Task{t}, now); err != nil {
				return err
			}
		}
		if err := tx.Set(ref, t); err != nil {
			return err
		}
		if err := s.writeSuperseded(tx, w.closed, "", now); err != nil {
			return err
		}
		return s.writeClosed(tx, discarded, "", DeadLetterDiscarded, ErasedBy(t.Tenant), now)
	}, s.txOptions()...)
	if err != nil {
		return nil, nil, fmt.Errorf("erase task %s: %w", id, err)
	}
	return out, discarded, nil
}
