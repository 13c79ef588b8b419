package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/internal/safetext"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Collections of the dlqnotifier.
const (
	AlertsCollection = "alerts"
)

// DeadLetterState is where a dead letter is in the human gate.
type DeadLetterState string

// Dead-letter states: open until a human (or an operator) decides.
const (
	DeadLetterOpen        DeadLetterState = "open"
	DeadLetterRedelivered DeadLetterState = "redelivered"
	DeadLetterRegenerated DeadLetterState = "regenerated"
	DeadLetterDiscarded   DeadLetterState = "discarded"
	// DeadLetterSuperseded closes a delivery dead letter the task has moved past — a newer event
	// replaced the dead delivery, or a regeneration started a new replay — so that nothing is left
	// to decide on it.
	DeadLetterSuperseded DeadLetterState = "superseded"
)

// DeadLetter is the dead_letters/{task_id}:{stage}:{replay}:{round} document: one death of a
// task's generation (replay) or of one round of its webhook delivery, and what a human decided.
type DeadLetter struct {
	ID string `firestore:"-" json:"id"`

	TaskID    string          `firestore:"task_id" json:"task_id"`
	Tenant    string          `firestore:"tenant" json:"tenant"`
	Family    string          `firestore:"family" json:"family"`
	Variant   string          `firestore:"variant" json:"variant"`
	Stage     task.Stage      `firestore:"stage" json:"stage"`
	Replay    int             `firestore:"replay" json:"replay"`
	Round     int             `firestore:"round" json:"round"`
	State     DeadLetterState `firestore:"state" json:"state"`
	EventID   string          `firestore:"event_id,omitempty" json:"event_id,omitempty"`     // delivery stage: the event that died
	EventType task.EventType  `firestore:"event_type,omitempty" json:"event_type,omitempty"` // delivery stage
	Attempts  int             `firestore:"attempts" json:"attempts"`
	LastError string          `firestore:"last_error,omitempty" json:"last_error,omitempty"`
	Usage     task.Usage      `firestore:"usage" json:"usage"` // tokens already paid for this replay
	CostUSD   float64         `firestore:"cost_usd" json:"cost_usd"`

	DecidedBy string     `firestore:"decided_by,omitempty" json:"decided_by,omitempty"`
	DecidedAt *time.Time `firestore:"decided_at,omitempty" json:"decided_at,omitempty"`
	// Applied is set once the decision's nudges are all published.
	Applied bool `firestore:"applied" json:"applied"`

	SlackChannel string `firestore:"slack_channel,omitempty" json:"slack_channel,omitempty"`
	SlackTS      string `firestore:"slack_ts,omitempty" json:"slack_ts,omitempty"`
	PostAttempts int    `firestore:"post_attempts" json:"post_attempts"` // failed Slack posts; sizes the notice's backoff
	// SlackFlood is the flood (FloodKey) whose one message counts this dead letter instead of a
	// message of its own.
	SlackFlood string `firestore:"slack_flood,omitempty" json:"slack_flood,omitempty"`

	CreatedAt time.Time `firestore:"created_at" json:"created_at"`
	UpdatedAt time.Time `firestore:"updated_at" json:"updated_at"`
}

// DeadLetters returns the dead_letters collection.
func (s *Store) DeadLetters() *firestore.CollectionRef { return s.FS.Collection(DeadLettersCollection) }

// GetDeadLetter reads one dead letter, or ErrNotFound.
func (s *Store) GetDeadLetter(ctx context.Context, id string) (*DeadLetter, error) {
	return getDoc(ctx, s.DeadLetters().Doc(id), "dead letter", decodeDeadLetter)
}

func decodeDeadLetter(snap *firestore.DocumentSnapshot) (*DeadLetter, error) {
	var d DeadLetter
	if err := snap.DataTo(&d); err != nil {
		return nil, fmt.Errorf("decode dead letter %s: %w", snap.Ref.ID, err)
	}
	d.ID = snap.Ref.ID
	return &d, nil
}

// ListDeadLetters returns up to limit dead letters in state, oldest first (query
// "dead-letters-by-state" of the registry).
func (s *Store) ListDeadLetters(ctx context.Context, state DeadLetterState, limit int) ([]*DeadLetter, error) {
	q := s.DeadLetters().Where("state", "==", string(state)).OrderBy("created_at", firestore.Asc).Limit(limit)
	return readAll(q.Documents(ctx), "list dead letters", decodeDeadLetter)
}

// Supersede records on d that the task moved past it (DeadLetterSuperseded).
func (d *DeadLetter) Supersede(now time.Time) {
	d.State, d.DecidedAt, d.Applied = DeadLetterSuperseded, &now, true
}

// writeSuperseded writes the dead letters ids closed (DeadLetterSuperseded) in tx; skip is the one
// the caller writes whole.
func (s *Store) writeSuperseded(tx *firestore.Transaction, ids []string, skip string, now time.Time) error {
	return s.writeClosed(tx, ids, skip, DeadLetterSuperseded, "", now)
}

// writeClosed writes the dead letters ids closed in state, decided by by (when not empty), in tx,
// with nothing left to apply; skip is the one the caller writes whole.
func (s *Store) writeClosed(tx *firestore.Transaction, ids []string, skip string, state DeadLetterState, by string, now time.Time) error {
	for _, id := range ids {
		if id == skip {
			continue
		}
		fields := map[string]any{"state": string(state), "decided_at": now, "applied": true, "updated_at": now}
		if by != "" {
			fields["decided_by"] = by
		}
		// A merge, not an update: a dead letter missing for whatever reason must not fail every
		// later write of its task.
		if err := tx.Set(s.DeadLetters().Doc(id), fields, firestore.MergeAll); err != nil {
			return err
		}
	}
	return nil
}

// DeadLetterFunc decides, from the task and its dead letter as read inside one transaction, what
// to change in both. d is never nil: a dead letter that does not exist yet has a zero CreatedAt,
// and is written only if fn gives it one. Like MutateFunc, fn may run more than once and returns
// ErrNoChange to write nothing.
type DeadLetterFunc func(t *protocol.Task, d *DeadLetter, now time.Time) error

// MutateDeadLetter runs fn over task taskID and dead letter id in one transaction, then writes
// both: the task as MutateTask writes it (nudge backoff reset, finalized), the dead letter if it
// exists or fn created it. It is the one way to change a dead letter together with its task (a
// notice recorded, a decision taken, a Slack post committed). It returns both as written, or
// ErrNotFound when the task does not exist.
func (s *Store) MutateDeadLetter(ctx context.Context, taskID, id string, fn DeadLetterFunc) (*protocol.Task, *DeadLetter, error) {
	tref, dref := s.Tasks().Doc(taskID), s.DeadLetters().Doc(id)
	var outT *protocol.Task
	var outD *DeadLetter
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		outT, outD = nil, nil
		snaps, err := tx.GetAll([]*firestore.DocumentRef{tref, dref})
		if err != nil {
			return err
		}
		if !snaps[0].Exists() {
			return ErrNotFound
		}
		read := func() (*DeadLetter, error) {
			if !snaps[1].Exists() {
				return &DeadLetter{ID: id}, nil
			}
			return decodeDeadLetter(snaps[1])
		}
		d, err := read()
		if err != nil {
			return err
		}
		now := s.now()
		t, changed, w, err := s.applySnap(snaps[0], now, func(t *protocol.Task, now time.Time) error { return fn(t, d, now) })
		if err != nil {
			return err
		}
		if !changed {
			outT = t
			outD, err = read()
			return err
		}
		closed := w.closed
		if w.freed {
			if err := s.freeSlotsTx(tx, []*protocol.Task{t}, now); err != nil {
				return err
			}
		}
		if err := tx.Set(tref, t); err != nil {
			return err
		}
		outT, outD = t, d
		skip := ""
		if !d.CreatedAt.IsZero() {
			skip = id
			if slices.Contains(closed, id) {
				d.Supersede(now)
			}
		}
		if err := s.writeSuperseded(tx, closed, skip, now); err != nil {
			return err
		}
		if d.CreatedAt.IsZero() {
			return nil
		}
		d.UpdatedAt = now
		d.LastError = safetext.Error(d.LastError)
		return tx.Set(dref, d)
	}, s.txOptions()...)
	if err != nil {
		return nil, nil, fmt.Errorf("mutate dead letter %s: %w", id, err)
	}
	return outT, outD, nil
}

// Alert is the alerts/{key} document: when an alert of that key was last posted, so a
// repeated alert within its cooldown is posted once, whichever instance receives it.
type Alert struct {
	LastPostedAt time.Time `firestore:"last_posted_at"`
	Count        int       `firestore:"count"` // alerts received with this key
}

// ClaimAlert records an alert of key and reports whether it is to be posted: true when none was
// posted within cooldown, in which case last_posted_at becomes now (one transaction, so two
// instances never both post). prev is the previous post time, for UnclaimAlert.
func (s *Store) ClaimAlert(ctx context.Context, key string, cooldown time.Duration) (post bool, prev time.Time, err error) {
	ref := s.FS.Collection(AlertsCollection).Doc(key)
	err = s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		post, prev = false, time.Time{}
		var a Alert
		if _, err := txReadIfExists(tx, ref, "alert", &a); err != nil {
			return err
		}
		now := s.now()
		a.Count++
		prev = a.LastPostedAt
		if a.LastPostedAt.IsZero() || !now.Before(a.LastPostedAt.Add(cooldown)) {
			post = true
			a.LastPostedAt = now
		}
		return tx.Set(ref, a)
	})
	if err != nil {
		return false, time.Time{}, fmt.Errorf("claim alert %s: %w", key, err)
	}
	return post, prev, nil
}

// UnclaimAlert puts back the previous post time of key after a post that failed, so the next
// alert of that key is posted.
func (s *Store) UnclaimAlert(ctx context.Context, key string, prev time.Time) error {
	_, err := s.FS.Collection(AlertsCollection).Doc(key).Update(ctx, []firestore.Update{{Path: "last_posted_at", Value: prev}})
	if err != nil {
		return fmt.Errorf("unclaim alert %s: %w", key, err)
	}
	return nil
}
