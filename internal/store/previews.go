package store

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// PreviewsCollection holds the partial output of streamed tasks: previews/{task_id}.
const PreviewsCollection = "previews"

// previewRetention is how long a preview is kept after its last write (TTL on expire_at).
const previewRetention = time.Hour

// Preview is the previews/{task_id} document: the text generated so far by the call of one claim
// of a streamed task. It is a document of its own so that preview writes never contend with the
// task's transactions, and it is never the output: the output is what the worker commits on the
// task under the outbox's rules, and webhooks carry only that.
type Preview struct {
	Replay    int       `firestore:"replay"`
	Epoch     int64     `firestore:"epoch"` // the lease epoch of the call that wrote it
	Text      string    `firestore:"text"`
	UpdatedAt time.Time `firestore:"updated_at"`
	ExpireAt  time.Time `firestore:"expire_at"`
}

// SavePreview writes task id's preview (a plain write: the latest call's text wins).
func (s *Store) SavePreview(ctx context.Context, id string, p Preview) error {
	now := s.now()
	p.UpdatedAt, p.ExpireAt = now, now.Add(previewRetention)
	if _, err := s.FS.Collection(PreviewsCollection).Doc(id).Set(ctx, p); err != nil {
		return fmt.Errorf("save preview of %s: %w", id, err)
	}
	return nil
}

// WatchTask yields task id as it is now, then again after every change, until ctx ends or the
// listener fails (the error is yielded last; ErrNotFound when the task does not exist or is
// deleted). It is a Firestore snapshot listener: a change is yielded once, in order, and changes
// that follow each other quickly may be yielded as their last state only.
func (s *Store) WatchTask(ctx context.Context, id string) iter.Seq2[*protocol.Task, error] {
	return func(yield func(*protocol.Task, error) bool) {
		for snap, err := range watch(ctx, s.Tasks().Doc(id)) {
			if err != nil {
				yield(nil, fmt.Errorf("watch task %s: %w", id, err))
				return
			}
			t, err := DecodeTask(snap)
			if !yield(t, err) || err != nil {
				return
			}
		}
	}
}

// WatchPreview yields task id's preview after every write, as WatchTask does; a task without a
// preview yet yields nothing until its first one.
func (s *Store) WatchPreview(ctx context.Context, id string) iter.Seq2[*Preview, error] {
	return func(yield func(*Preview, error) bool) {
		for snap, err := range watch(ctx, s.FS.Collection(PreviewsCollection).Doc(id)) {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				yield(nil, fmt.Errorf("watch preview of %s: %w", id, err))
				return
			}
			var p Preview
			if err := snap.DataTo(&p); err != nil {
				yield(nil, fmt.Errorf("decode preview of %s: %w", id, err))
				return
			}
			if !yield(&p, nil) {
				return
			}
		}
	}
}

// watch yields the snapshots of ref (ErrNotFound for a missing document, and the listener goes
// on) until ctx ends, when it returns quietly, or the listener fails.
func watch(ctx context.Context, ref *firestore.DocumentRef) iter.Seq2[*firestore.DocumentSnapshot, error] {
	return func(yield func(*firestore.DocumentSnapshot, error) bool) {
		it := ref.Snapshots(ctx)
		defer it.Stop()
		for {
			snap, err := it.Next()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				if status.Code(err) == codes.Canceled {
					return
				}
				yield(nil, err)
				return
			case !snap.Exists():
				if !yield(nil, ErrNotFound) {
					return
				}
			default:
				if !yield(snap, nil) {
					return
				}
			}
		}
	}
}
