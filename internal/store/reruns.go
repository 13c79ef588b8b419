package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/pkg/claim"
	"github.com/genbox-dev/genbox/pkg/task"
)

// RerunsCollection holds the re-runs of POST /v1/tasks:rerun: reruns/{id}.
const RerunsCollection = "reruns"

// Rerun is the reruns/{id} document: a tenant's bulk re-run of the tasks its filter matches,
// the pacer's cursor through them, and its progress. Its pacer holds Lease while it advances.
type Rerun struct {
	ID         string    `firestore:"-"`
	UpdateTime time.Time `firestore:"-"`

	Tenant      string           `firestore:"tenant"`
	RerunID     string           `firestore:"rerun_id"` // the id the API shows
	By          string           `firestore:"by"`       // who asked: the tenant's API, or a console operator
	RequestHash string           `firestore:"request_hash"`
	Filter      task.RerunFilter `firestore:"filter"`
	// Until bounds the tasks matched to those created before the re-run: what the estimate
	// counted, and never the tasks submitted while it runs.
	Until            time.Time       `firestore:"until"`
	State            task.RerunState `firestore:"state"`
	Count            int             `firestore:"count"`
	EstimatedCostUSD float64         `firestore:"estimated_cost_usd"`

	// Cursor is the last task of the last page the pacer committed; Exhausted: no task is left.
	Cursor    *RerunCursor       `firestore:"cursor,omitempty"`
	Exhausted bool               `firestore:"exhausted"`
	Progress  task.RerunProgress `firestore:"progress"`
	Lease     claim.Lease        `firestore:"lease"`

	CreatedAt   time.Time  `firestore:"created_at"`
	UpdatedAt   time.Time  `firestore:"updated_at"`
	CompletedAt *time.Time `firestore:"completed_at,omitempty"`
}

// RerunCursor is a position in the newest-first order of a tenant's tasks.
type RerunCursor struct {
	CreatedAt time.Time `firestore:"created_at"`
	ID        string    `firestore:"id"`
}

// View returns the re-run as the API shows it.
func (r *Rerun) View() task.Rerun {
	p := r.Progress
	created := r.CreatedAt
	return task.Rerun{RerunID: r.RerunID, State: r.State, Filter: r.Filter, Count: r.Count,
		EstimatedCostUSD: r.EstimatedCostUSD, Progress: &p, CreatedAt: &created, CompletedAt: r.CompletedAt}
}

// Reruns returns the reruns collection.
func (s *Store) Reruns() *firestore.CollectionRef { return s.FS.Collection(RerunsCollection) }

func decodeRerun(snap *firestore.DocumentSnapshot) (*Rerun, error) {
	var r Rerun
	if err := snap.DataTo(&r); err != nil {
		return nil, fmt.Errorf("decode rerun %s: %w", snap.Ref.ID, err)
	}
	r.ID, r.UpdateTime = snap.Ref.ID, snap.UpdateTime
	return &r, nil
}

// CreateRerun writes a new re-run; ErrExists when its id is taken.
func (s *Store) CreateRerun(ctx context.Context, r *Rerun) error {
	now := s.now()
	r.CreatedAt, r.UpdatedAt = now, now
	wr, err := s.Reruns().Doc(r.ID).Create(ctx, r)
	if status.Code(err) == codes.AlreadyExists {
		return fmt.Errorf("create rerun %s: %w", r.ID, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create rerun %s: %w", r.ID, err)
	}
	r.UpdateTime = wr.UpdateTime
	return nil
}

// GetRerun reads one re-run.
func (s *Store) GetRerun(ctx context.Context, id string) (*Rerun, error) {
	return getDoc(ctx, s.Reruns().Doc(id), "rerun", decodeRerun)
}

// SaveRerun writes what a pacer changes — lease, cursor, progress, state — only if nobody
// wrote the document since r was read (ErrChanged otherwise), and updates r.UpdateTime.
func (s *Store) SaveRerun(ctx context.Context, r *Rerun) error {
	r.UpdatedAt = s.now()
	var cursor, completed any = firestore.Delete, firestore.Delete
	if r.Cursor != nil {
		cursor = r.Cursor
	}
	if r.CompletedAt != nil {
		completed = *r.CompletedAt
	}
	wr, err := s.Reruns().Doc(r.ID).Update(ctx, []firestore.Update{
		{Path: "lease", Value: r.Lease}, {Path: "cursor", Value: cursor}, {Path: "exhausted", Value: r.Exhausted},
		{Path: "progress", Value: r.Progress}, {Path: "state", Value: r.State}, {Path: "updated_at", Value: r.UpdatedAt},
		{Path: "completed_at", Value: completed},
	}, firestore.LastUpdateTime(r.UpdateTime))
	if status.Code(err) == codes.FailedPrecondition {
		return fmt.Errorf("save rerun %s: %w", r.ID, ErrChanged)
	}
	if err != nil {
		return fmt.Errorf("save rerun %s: %w", r.ID, err)
	}
	r.UpdateTime = wr.UpdateTime
	return nil
}

// RunningReruns lists the re-runs still running (query "running-reruns").
func (s *Store) RunningReruns(ctx context.Context) ([]*Rerun, error) {
	return readAll(s.Reruns().Where("state", "==", string(task.RerunRunning)).Documents(ctx), "running reruns", decodeRerun)
}

// RerunFields are the task fields a re-run's filter and estimate read: not the input (up to
// 256 KiB), needed only to price a task no model answered.
var RerunFields = []string{"tenant", "state", "family", "variant", "labels", "prompt_version", "gen_config",
	"model_chain", "max_cost_usd", "mode", "usage", "model", "erased_at", "open_dead_letters", "rerun", "created_at"}

// rerunQuery is the tasks of tenant that f may match and were created before until, newest
// first: family and the creation bounds are in the query (tasks-by-tenant, or
// console-tasks-by-tenant-family with a family), the rest of f is matched by the caller. Its
// order does not change as tasks are re-run, so a cursor in it holds across a crash.
func (s *Store) rerunQuery(tenant string, f task.RerunFilter, until time.Time) firestore.Query {
	q := s.Tasks().Where("tenant", "==", tenant)
	if f.Family != "" {
		q = q.Where("family", "==", f.Family)
	}
	if f.CreatedAfter != nil {
		q = q.Where("created_at", ">=", *f.CreatedAfter)
	}
	if f.CreatedBefore != nil && f.CreatedBefore.Before(until) {
		until = *f.CreatedBefore
	}
	q = q.Where("created_at", "<", until)
	return q.OrderBy("created_at", firestore.Desc).OrderBy(firestore.DocumentID, firestore.Desc)
}

// EachRerunCandidate calls fn with each task rerunQuery finds, holding RerunFields only, until
// fn returns an error (returned) or the tasks end.
func (s *Store) EachRerunCandidate(ctx context.Context, tenant string, f task.RerunFilter, until time.Time, fn func(*protocol.Task) error) error {
	it := s.rerunQuery(tenant, f, until).Select(RerunFields...).Documents(ctx)
	defer it.Stop()
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("rerun candidates of %s: %w", tenant, err)
		}
		t, err := DecodeTask(snap)
		if err != nil {
			return err
		}
		if err := fn(t); err != nil {
			return err
		}
	}
}

// RerunPage returns the next limit tasks of r's query after its cursor, whole (the pacer writes
// them back), and whether they are the last.
func (s *Store) RerunPage(ctx context.Context, r *Rerun, limit int) (tasks []*protocol.Task, last bool, err error) {
	q := s.rerunQuery(r.Tenant, r.Filter, r.Until)
	if r.Cursor != nil {
		q = q.StartAfter(r.Cursor.CreatedAt, s.Tasks().Doc(r.Cursor.ID))
	}
	out, err := readAll(q.Limit(limit).Documents(ctx), "rerun page of "+r.ID, DecodeTask)
	if err != nil {
		return nil, false, err
	}
	return out, len(out) < limit, nil
}

// RerunCounts is how many of a re-run's tasks are in each phase of their new replay.
type RerunCounts struct {
	Done     int // succeeded
	Failed   int // ended otherwise
	InFlight int // queued, running or waiting
}

// RerunCounts counts the tasks re-run id started by the phase of their replay (query
// "tasks-of-rerun": count aggregations, reading no document). A task a later re-run started
// again is that one's.
func (s *Store) RerunCounts(ctx context.Context, id string) (RerunCounts, error) {
	q := s.Tasks().Where("rerun", "==", id)
	count := func(states ...task.State) (int, error) {
		in := make([]string, len(states))
		for i, st := range states {
			in[i] = string(st)
		}
		sq := q.Where("state", "in", in)
		res, err := sq.NewAggregationQuery().WithCount("n").Get(ctx)
		if err != nil {
			return 0, fmt.Errorf("count tasks of rerun %s: %w", id, err)
		}
		return int(countOf(res["n"])), nil
	}
	// In flight first: a replay that ends between the counts is then counted as ended, never
	// missed by both.
	var c RerunCounts
	var err error
	if c.InFlight, err = count(task.StateQueued, task.StateRunning, task.StateWaiting); err != nil {
		return c, err
	}
	if c.Done, err = count(task.StateSucceeded); err != nil {
		return c, err
	}
	if c.Failed, err = count(task.StateFailed, task.StateDead, task.StateDiscarded, task.StateCancelled); err != nil {
		return c, err
	}
	return c, nil
}
