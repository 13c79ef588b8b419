package store

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SchedulesCollection holds the recurring schedules (internal/schedule).
const SchedulesCollection = "schedules"

// Schedule is a schedules/{id} document: a cron expression in a time zone and the task request
// each fire submits. NextFireAt is unset while the schedule is paused, so the firer's query
// (next_fire_at <= now) never returns it.
type Schedule struct {
	ID       string `firestore:"-"`
	Tenant   string `firestore:"tenant"`
	Cron     string `firestore:"cron"`
	TimeZone string `firestore:"time_zone"`
	// Task is the task request template as JSON, as POST /v1/tasks takes it.
	Task    string `firestore:"task"`
	Overlap string `firestore:"overlap"`
	CatchUp string `firestore:"catch_up"`
	Paused  bool   `firestore:"paused"`

	NextFireAt *time.Time `firestore:"next_fire_at,omitempty"`
	LastFireAt *time.Time `firestore:"last_fire_at,omitempty"`
	// LastTaskID is the task of the latest fire submitted: the one an overlap policy of skip
	// waits on.
	LastTaskID string `firestore:"last_task_id,omitempty"`
	Fires      int64  `firestore:"fires"`
	Skipped    int64  `firestore:"skipped"`
	// LastError is why the latest fire that failed was refused (its template no longer validates).
	LastError string `firestore:"last_error,omitempty"`

	IdempotencyKey string    `firestore:"idempotency_key,omitempty"`
	RequestHash    string    `firestore:"request_hash,omitempty"`
	CreatedAt      time.Time `firestore:"created_at"`
	UpdatedAt      time.Time `firestore:"updated_at"`

	UpdateTime time.Time `firestore:"-"`
}

// Schedules returns the schedules collection.
func (s *Store) Schedules() *firestore.CollectionRef { return s.FS.Collection(SchedulesCollection) }

// DecodeSchedule decodes a schedule snapshot.
func DecodeSchedule(snap *firestore.DocumentSnapshot) (*Schedule, error) {
	var sc Schedule
	if err := snap.DataTo(&sc); err != nil {
		return nil, fmt.Errorf("decode schedule %s: %w", snap.Ref.ID, err)
	}
	sc.ID, sc.UpdateTime = snap.Ref.ID, snap.UpdateTime
	return &sc, nil
}

// CreateSchedule writes a new schedule; ErrExists when its id is taken.
func (s *Store) CreateSchedule(ctx context.Context, sc *Schedule) error {
	now := s.now()
	sc.CreatedAt, sc.UpdatedAt = now, now
	wr, err := s.Schedules().Doc(sc.ID).Create(ctx, sc)
	if status.Code(err) == codes.AlreadyExists {
		return fmt.Errorf("create schedule %s: %w", sc.ID, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create schedule %s: %w", sc.ID, err)
	}
	sc.UpdateTime = wr.UpdateTime
	return nil
}

// GetSchedule reads one schedule.
func (s *Store) GetSchedule(ctx context.Context, id string) (*Schedule, error) {
	return getDoc(ctx, s.Schedules().Doc(id), "schedule", DecodeSchedule)
}

// MutateSchedule changes schedule id in a transaction (mutateDoc): fn decides from the document
// as read.
func (s *Store) MutateSchedule(ctx context.Context, id string, fn func(sc *Schedule, now time.Time) error) (*Schedule, error) {
	return mutateDoc(ctx, s, s.Schedules().Doc(id), DecodeSchedule, func(sc *Schedule, now time.Time) error {
		if err := fn(sc, now); err != nil {
			return err
		}
		sc.UpdatedAt = now
		return nil
	})
}

// DeleteSchedule deletes schedule id once check accepts it as read; the delete is conditioned on
// that read, so a schedule changed in between is read and checked again.
func (s *Store) DeleteSchedule(ctx context.Context, id string, check func(sc *Schedule) error) error {
	return s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		ref := s.Schedules().Doc(id)
		snap, err := tx.Get(ref)
		if status.Code(err) == codes.NotFound {
			return fmt.Errorf("schedule %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		sc, err := DecodeSchedule(snap)
		if err != nil {
			return err
		}
		if err := check(sc); err != nil {
			return err
		}
		return tx.Delete(ref)
	}, s.txOptions()...)
}

// ListSchedules returns up to limit of tenant's schedules in id order, starting after the id
// after (from the start when empty), and the id to start the next page after ("" on the last
// page). It runs the schedules-by-tenant query.
func (s *Store) ListSchedules(ctx context.Context, tenant string, limit int, after string) ([]*Schedule, string, error) {
	q := s.Schedules().Where("tenant", "==", tenant).OrderBy(firestore.DocumentID, firestore.Asc)
	if after != "" {
		q = q.StartAfter(after)
	}
	out, err := readAll(q.Limit(limit+1).Documents(ctx), "list schedules of "+tenant, DecodeSchedule)
	if err != nil || len(out) <= limit {
		return out, "", err
	}
	return out[:limit], out[limit-1].ID, nil
}

// DueSchedules returns up to limit schedules whose next fire time is at or before now, earliest
// first (the schedules-due query).
func (s *Store) DueSchedules(ctx context.Context, now time.Time, limit int) ([]*Schedule, error) {
	q := s.Schedules().Where("next_fire_at", "<=", now).OrderBy("next_fire_at", firestore.Asc).Limit(limit)
	return readAll(q.Documents(ctx), "due schedules", DecodeSchedule)
}

// AdvanceSchedule records what a firer did with sc, as it read it: the next fire time, the
// latest fire and its task, the fires submitted and skipped, the latest refusal. The write is
// conditioned on sc's update time: a schedule changed since (patched, paused, deleted, advanced
// by another firer) is left as it is, and ErrChanged is returned.
func (s *Store) AdvanceSchedule(ctx context.Context, sc *Schedule, next, lastFire *time.Time, lastTask string, fired, skipped int, lastError string) error {
	ups := []firestore.Update{
		{Path: "next_fire_at", Value: orDelete(next)},
		{Path: "fires", Value: firestore.Increment(fired)},
		{Path: "skipped", Value: firestore.Increment(skipped)},
	}
	if lastFire != nil {
		ups = append(ups, firestore.Update{Path: "last_fire_at", Value: *lastFire}, firestore.Update{Path: "last_task_id", Value: lastTask})
	}
	if lastError != "" {
		ups = append(ups, firestore.Update{Path: "last_error", Value: lastError})
	}
	if err := updateUnchanged(ctx, s.Schedules().Doc(sc.ID), ups, sc.UpdateTime); err != nil {
		return fmt.Errorf("advance schedule %s: %w", sc.ID, err)
	}
	return nil
}

// AllSchedules returns up to limit schedules of every tenant, in id order (the console's
// listing).
func (s *Store) AllSchedules(ctx context.Context, limit int) ([]*Schedule, error) {
	q := s.Schedules().OrderBy(firestore.DocumentID, firestore.Asc).Limit(limit)
	return readAll(q.Documents(ctx), "list schedules", DecodeSchedule)
}
