package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/secretbox"
)

// Sentinel errors.
var (
	// ErrNotFound means the document does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrExists means Create found a document with the same id.
	ErrExists = errors.New("store: already exists")
	// ErrNoChange, returned by a Mutate function, ends the transaction without writing.
	ErrNoChange = errors.New("store: no change")
)

// DefaultRetention is how long a finished task (and so its idempotency key) is kept.
const DefaultRetention = 7 * 24 * time.Hour

// Store reads and writes genbox documents. It is safe for concurrent use.
type Store struct {
	FS        *firestore.Client
	Now       func() time.Time
	Retention time.Duration
	// MaxAttempts bounds a transaction's attempts under contention (the client's default is 5).
	MaxAttempts int
	// Secrets seals the webhook secrets CreateTenant and RotateWebhookSecret write and opens
	// those WebhookSecrets reads; nil: neither can.
	Secrets *secretbox.Box
}

// New returns a Store on client with the default retention and the wall clock.
func New(client *firestore.Client) *Store {
	return &Store{FS: client, Now: time.Now, Retention: DefaultRetention}
}

// now is truncated to Firestore's microsecond precision, so a task in memory equals the stored one.
func (s *Store) now() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }

// Tasks returns the tasks collection.
func (s *Store) Tasks() *firestore.CollectionRef { return s.FS.Collection(TasksCollection) }

// CreateTask writes a new task, finalized. It fails with ErrExists when the id is taken.
func (s *Store) CreateTask(ctx context.Context, t *Task) error {
	now := s.now()
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now
	}
	t.UpdatedAt = now
	Finalize(t, now, s.Retention)
	wr, err := s.Tasks().Doc(t.ID).Create(ctx, t)
	if status.Code(err) == codes.AlreadyExists {
		return fmt.Errorf("create task %s: %w", t.ID, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create task %s: %w", t.ID, err)
	}
	t.UpdateTime = wr.UpdateTime
	return nil
}

// GetTask reads one task.
func (s *Store) GetTask(ctx context.Context, id string) (*Task, error) {
	snap, err := s.Tasks().Doc(id).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("get task %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get task %s: %w", id, err)
	}
	return DecodeTask(snap)
}

// DecodeTask decodes a task snapshot.
func DecodeTask(snap *firestore.DocumentSnapshot) (*Task, error) {
	var t Task
	if err := snap.DataTo(&t); err != nil {
		return nil, fmt.Errorf("decode task %s: %w", snap.Ref.ID, err)
	}
	t.ID, t.UpdateTime = snap.Ref.ID, snap.UpdateTime
	return &t, nil
}

// MutateFunc decides, from the task as read inside a transaction, what to change. It may run more
// than once; it must only change t and return ErrNoChange (write nothing), nil (write t) or an
// error (abort). Decide inside, act after the transaction commits.
type MutateFunc func(t *Task, now time.Time) error

// MutateTask reads task id in a transaction, applies fn and writes the whole document back,
// finalized. A write counts as progress: the sweeper's nudge backoff is reset before fn runs. It
// returns the task as written (or as read, when fn returned ErrNoChange), or ErrNotFound.
func (s *Store) MutateTask(ctx context.Context, id string, fn MutateFunc) (*Task, error) {
	ref := s.Tasks().Doc(id)
	var out *Task
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		out = nil
		snap, err := tx.Get(ref)
		if status.Code(err) == codes.NotFound {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		t, changed, err := s.applyTask(snap, s.now(), fn)
		if err != nil || !changed {
			out = t
			return err
		}
		out = t
		return tx.Set(ref, t)
	}, s.txOptions()...)
	if err != nil {
		return nil, fmt.Errorf("mutate task %s: %w", id, err)
	}
	return out, nil
}

// applyTask is the task side of every read-modify-write: it decodes snap, resets the sweeper's
// nudge backoff (a write is progress), runs fn and, when fn changed something, stamps updated_at
// and finalizes due_at and what follows from it. Unchanged, it returns the task as read.
func (s *Store) applyTask(snap *firestore.DocumentSnapshot, now time.Time, fn MutateFunc) (*Task, bool, error) {
	t, err := DecodeTask(snap)
	if err != nil {
		return nil, false, err
	}
	t.Nudges, t.NudgeAt = 0, nil
	if err := fn(t, now); errors.Is(err, ErrNoChange) {
		read, err := DecodeTask(snap)
		return read, false, err
	} else if err != nil {
		return nil, false, err
	}
	t.UpdatedAt = now
	Finalize(t, now, s.Retention)
	return t, true, nil
}

func (s *Store) txOptions() []firestore.TransactionOption {
	if s.MaxAttempts > 0 {
		return []firestore.TransactionOption{firestore.MaxAttempts(s.MaxAttempts)}
	}
	return nil
}
