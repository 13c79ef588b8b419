package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/secretbox"
	"github.com/genbox-dev/genbox/pkg/backoff"
)

// Sentinel errors.
var (
	// ErrNotFound means the document does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrExists means Create found a document with the same id.
	ErrExists = errors.New("store: already exists")
	// ErrNoChange, returned by a Mutate function, ends the transaction without writing.
	ErrNoChange = errors.New("store: no change")
	// ErrChanged means a write conditioned on the document as read found it changed (or gone).
	ErrChanged = errors.New("store: changed since read")
)

// DefaultRetention is how long a finished task (and so its idempotency key) is kept.
const DefaultRetention = 7 * 24 * time.Hour

// Store reads and writes genbox documents. It is safe for concurrent use.
type Store struct {
	FS        *firestore.Client
	Now       func() time.Time
	Retention time.Duration
	// Shards is the number of sweep shards (GENBOX_SWEEP_SHARDS) Finalize spreads due documents
	// over; 0 is one.
	Shards int
	// MaxAttempts bounds the attempts of a read-modify-write under contention: MutateTask's
	// conditioned writes, and the transactions of the other documents (default 5).
	MaxAttempts int
	// Secrets seals the webhook secrets CreateTenant and RotateWebhookSecret write and opens
	// those WebhookSecrets reads; nil: neither can.
	Secrets *secretbox.Box
}

// New returns a Store on client with the default retention and the wall clock.
func New(client *firestore.Client) *Store {
	return &Store{FS: client, Now: time.Now, Retention: DefaultRetention}
}

// Clock is the store's clock, as it stamps documents and leases.
func (s *Store) Clock() time.Time { return s.now() }

// now is truncated to Firestore's microsecond precision, so a task in memory equals the stored one.
func (s *Store) now() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }

// Tasks returns the tasks collection.
func (s *Store) Tasks() *firestore.CollectionRef { return s.FS.Collection(TasksCollection) }

// CreateTask writes a new task, finalized. It fails with ErrExists when the id is taken.
func (s *Store) CreateTask(ctx context.Context, t *protocol.Task) error {
	now := s.now()
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now
	}
	t.UpdatedAt = now
	protocol.Finalize(t, now, s.Retention, s.Shards)
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
func (s *Store) GetTask(ctx context.Context, id string) (*protocol.Task, error) {
	return getDoc(ctx, s.Tasks().Doc(id), "task", DecodeTask)
}

// DecodeTask decodes a task snapshot.
func DecodeTask(snap *firestore.DocumentSnapshot) (*protocol.Task, error) {
	var t protocol.Task
	if err := snap.DataTo(&t); err != nil {
		return nil, fmt.Errorf("decode task %s: %w", snap.Ref.ID, err)
	}
	t.ID, t.UpdateTime = snap.Ref.ID, snap.UpdateTime
	return &t, nil
}

// MutateFunc decides, from the task as read, what to change. It may run more than once; it must
// only change t and return ErrNoChange (write nothing), nil (write t) or an error (abort). Decide
// inside, act after MutateTask returns.
type MutateFunc func(t *protocol.Task, now time.Time) error

// defaultAttempts bounds MutateTask's reads and writes under contention when MaxAttempts is 0.
const defaultAttempts = 5

// MutateTask reads task id, applies fn and writes the whole document back, finalized, only if
// nobody wrote it since the read (a write conditioned on the update time read); when someone did,
// it reads again and fn decides again. A write counts as progress: the sweeper's nudge backoff is
// reset before fn runs. It returns the task as written (or as read, when fn returned ErrNoChange),
// or ErrNotFound; a document changed under every attempt ends in codes.Aborted.
//
// It runs no transaction on purpose: a transaction locks the document from its read to its
// commit, and a process killed in between leaves it locked until Firestore expires the
// transaction (about a minute, on the emulator as in production) — every claim, output and
// delivery of that task waits, or aborts, until then. A conditioned write holds nothing.
func (s *Store) MutateTask(ctx context.Context, id string, fn MutateFunc) (*protocol.Task, error) {
	return s.MutateTaskFrom(ctx, &protocol.Task{ID: id}, fn)
}

// MutateTaskFrom is MutateTask starting from known, the task as this process last read or wrote
// it (with its UpdateTime; a zero UpdateTime means unknown, and the task is read first): fn runs
// on a copy of known and the write is conditioned on known's update time, so a document nobody
// changed since costs no read. Only that write is taken from the copy: when the document changed
// since, or fn returns ErrNoChange or an error, the task is read and fn decides again on what is
// stored, as in MutateTask.
func (s *Store) MutateTaskFrom(ctx context.Context, known *protocol.Task, fn MutateFunc) (*protocol.Task, error) {
	return s.MutateTaskWith(ctx, known, func(t *protocol.Task, now time.Time) ([]Write, error) { return nil, fn(t, now) })
}

// WithFunc is a MutateFunc that also names other documents to write in the same commit as the
// task (Write): the tasks and slot counts a change of the task moves with it. It may run more
// than once, as a MutateFunc does.
type WithFunc func(t *protocol.Task, now time.Time) ([]Write, error)

// MutateTaskWith is MutateTaskFrom whose fn may name other documents to write in the same
// commit, each conditioned on its own read: when any of them changed since, nothing is written,
// the task is read again and fn decides again.
func (s *Store) MutateTaskWith(ctx context.Context, known *protocol.Task, fn WithFunc) (*protocol.Task, error) {
	id := known.ID
	ref := s.Tasks().Doc(id)
	attempts := s.MaxAttempts
	if attempts <= 0 {
		attempts = defaultAttempts
	}
	if !known.UpdateTime.IsZero() {
		now := s.now()
		t, changed, w, err := s.applyTask(known.Clone(), now, fn)
		if err == nil && changed {
			err = s.freeSlot(ctx, t, &w)
		}
		if err == nil && changed {
			switch err := s.writeTask(ctx, ref, t, known.UpdateTime, w, now); status.Code(err) {
			case codes.OK:
				return t, nil
			case codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists: // changed since: read it
			default:
				return nil, fmt.Errorf("mutate task %s: %w", id, err)
			}
		}
	}
	for attempt := 1; ; attempt++ {
		snap, err := ref.Get(ctx)
		if status.Code(err) == codes.NotFound {
			return nil, fmt.Errorf("mutate task %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("mutate task %s: %w", id, err)
		}
		now := s.now()
		t, changed, w, err := s.applySnapWith(snap, now, fn)
		if err != nil {
			return nil, fmt.Errorf("mutate task %s: %w", id, err)
		}
		if !changed {
			return t, nil
		}
		if err := s.freeSlot(ctx, t, &w); err != nil {
			return nil, fmt.Errorf("mutate task %s: %w", id, err)
		}
		err = s.writeTask(ctx, ref, t, snap.UpdateTime, w, now)
		switch status.Code(err) {
		case codes.OK:
			return t, nil
		case codes.NotFound:
			return nil, fmt.Errorf("mutate task %s: %w", id, ErrNotFound)
		case codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists: // written meanwhile, or locked by a transaction
			if attempt < attempts {
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("mutate task %s: %w", id, ctx.Err())
				case <-time.After(contentionBackoff.Delay(attempt, nil)):
				}
				continue
			}
			return nil, fmt.Errorf("mutate task %s: %w", id, status.Errorf(codes.Aborted, "changed under each of %d attempts: %v", attempts, err))
		}
		return nil, fmt.Errorf("mutate task %s: %w", id, err)
	}
}

// written is what a task's read-modify-write commits besides the task: the dead letters the
// change superseded (closed) and the documents its function named (with); freed: the task gave
// up its tenant's slot without handing it on, and the count goes down in the same commit
// (settleSlot).
type written struct {
	closed []string
	with   []Write
	freed  bool
}

// writeTask writes t over the document read at read, conditioned on that update time, with the
// dead letters it superseded closed and the documents its function named written in the same
// commit. Without any, it is one conditioned update. With some, it is a transaction that only
// writes: it reads nothing, so it locks nothing between a read and its commit, and a process
// killed in it leaves no lock behind. Either way t, and each task written with it, gets the
// update time written, so that the next conditioned write of either costs no read.
func (s *Store) writeTask(ctx context.Context, ref *firestore.DocumentRef, t *protocol.Task, read time.Time, w written, now time.Time) error {
	if len(w.closed) == 0 && len(w.with) == 0 {
		wr, err := ref.Update(ctx, documentUpdates(t), firestore.LastUpdateTime(read))
		if err == nil {
			t.UpdateTime = wr.UpdateTime
		}
		return err
	}
	var resp firestore.CommitResponse
	err := s.FS.RunTransaction(ctx, func(_ context.Context, tx *firestore.Transaction) error {
		if err := tx.Update(ref, documentUpdates(t), firestore.LastUpdateTime(read)); err != nil {
			return err
		}
		for _, o := range w.with {
			if err := s.writeOther(tx, o, now); err != nil {
				return err
			}
		}
		if len(w.closed) == 0 {
			return nil
		}
		return s.writeSuperseded(tx, w.closed, "", now)
	}, firestore.MaxAttempts(1), firestore.WithCommitResponseTo(&resp))
	if err != nil {
		return err
	}
	if wrs, err := resp.WriteResults(); err == nil && len(wrs) > len(w.with) {
		t.UpdateTime = wrs[0].UpdateTime
		for i, o := range w.with {
			if o.task != nil {
				o.task.UpdateTime = wrs[i+1].UpdateTime
			}
		}
	}
	return nil
}

// contentionBackoff is the jittered wait before attempt n+1 of a contended write.
var contentionBackoff = backoff.Policy{Base: 20 * time.Millisecond, Max: 500 * time.Millisecond, Jitter: backoff.Equal}

// taskFields are the document fields of Task: name, whether an empty value is left out, and the
// struct field's index.
var taskFields = sync.OnceValue(func() []docField {
	typ := reflect.TypeFor[protocol.Task]()
	var out []docField
	for i := range typ.NumField() {
		name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("firestore"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, docField{name: name, omitEmpty: opts == "omitempty", index: i})
	}
	return out
})

type docField struct {
	name      string
	omitEmpty bool
	index     int
}

// documentUpdates is t as an update of every field of the document, an empty omitempty field
// deleted: written by Update, it leaves the document as Set would have, with a precondition Set
// does not take.
func documentUpdates(t *protocol.Task) []firestore.Update {
	v := reflect.ValueOf(t).Elem()
	fields := taskFields()
	ups := make([]firestore.Update, 0, len(fields))
	for _, f := range fields {
		fv := v.Field(f.index)
		val := fv.Interface()
		if f.omitEmpty && empty(fv) {
			val = firestore.Delete
		}
		ups = append(ups, firestore.Update{Path: f.name, Value: val})
	}
	return ups
}

// empty is what omitempty leaves out: a zero value, or an empty slice or map.
func empty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Slice, reflect.Map:
		return v.Len() == 0
	}
	return v.IsZero()
}

// applyTask is the task side of every read-modify-write: given t as read (which it may change),
// it resets the sweeper's nudge backoff (a write is progress), runs fn and, when fn changed
// something, closes the dead letters the change superseded (their ids are returned, for the
// caller to write in the same transaction), stamps updated_at and finalizes due_at and what
// follows from it. Unchanged, it returns the task as read.
func (s *Store) applyTask(t *protocol.Task, now time.Time, fn WithFunc) (_ *protocol.Task, changed bool, w written, err error) {
	read := t.Clone()
	t.Nudges, t.NudgeAt = 0, nil
	with, err := fn(t, now)
	if errors.Is(err, ErrNoChange) {
		return read, false, written{}, nil
	} else if err != nil {
		return nil, false, written{}, err
	}
	w = written{closed: t.SupersedeDeadLetters(), with: with, freed: settleSlot(read, t, with)}
	t.UpdatedAt = now
	protocol.Finalize(t, now, s.Retention, s.Shards)
	return t, true, w, nil
}

// applySnapWith is applyTask on the task snap holds.
func (s *Store) applySnapWith(snap *firestore.DocumentSnapshot, now time.Time, fn WithFunc) (*protocol.Task, bool, written, error) {
	t, err := DecodeTask(snap)
	if err != nil {
		return nil, false, written{}, err
	}
	return s.applyTask(t, now, fn)
}

// applySnap is applyTask on the task snap holds, for a change that writes no other document
// than the dead letters it supersedes and the slot count of a slot it frees (freeSlotTx).
func (s *Store) applySnap(snap *firestore.DocumentSnapshot, now time.Time, fn MutateFunc) (*protocol.Task, bool, written, error) {
	return s.applySnapWith(snap, now, func(t *protocol.Task, now time.Time) ([]Write, error) { return nil, fn(t, now) })
}

func (s *Store) txOptions() []firestore.TransactionOption {
	if s.MaxAttempts > 0 {
		return []firestore.TransactionOption{firestore.MaxAttempts(s.MaxAttempts)}
	}
	return nil
}
