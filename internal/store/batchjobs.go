package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/pkg/task"
)

// BatchJobsCollection holds the batch_jobs/{id} documents.
const BatchJobsCollection = "batch_jobs"

// States of a batch_jobs document.
const (
	// BatchCreating: the document and its tasks' claims are written; batches.create may or may
	// not have been called. Whoever finds it so looks the job up by display name (the id) before
	// creating it, so a crash never makes a second job.
	BatchCreating = "creating"
	// BatchSubmitted: the Gemini job is known (gemini_name) and polled.
	BatchSubmitted = "submitted"
	// BatchSettling: the Gemini job is done; its responses are being persisted to their tasks,
	// or its tasks sent back.
	BatchSettling = "settling"
	// BatchDeleting: every task of the job is settled, and the Gemini job — which holds every
	// member's input and output — is not deleted yet: the batcher deletes it, again each pass
	// until Gemini answers.
	BatchDeleting = "deleting"
	// BatchDone: every task of the job is settled and the Gemini job, if there was one, deleted.
	BatchDone = "done"
)

// BatchJob is the batch_jobs/{id} document of one Gemini batch job (docs/cost.md): written, with
// its tasks' claims, before batches.create is called with the id as display name.
type BatchJob struct {
	ID         string    `firestore:"-"`
	UpdateTime time.Time `firestore:"-"`

	Model string `firestore:"model"`
	State string `firestore:"state"`
	// Open is true until the job is done: what the batcher's pass looks for.
	Open bool `firestore:"open"`
	// Members are the tasks of the job, each claimed at Epoch under the job's lease; the job's
	// request key of each is its task id.
	Members     []BatchMember `firestore:"members"`
	GeminiName  string        `firestore:"gemini_name,omitempty"`
	GeminiState string        `firestore:"gemini_state,omitempty"`
	// Deadline is when the job is cancelled if it has not ended, so that its tasks can still run
	// online before their own deadlines.
	Deadline time.Time `firestore:"deadline"`
	// LeaseUntil is when the members' batch lease expires unless renewed.
	LeaseUntil time.Time `firestore:"lease_until"`
	// Attempts counts failed batches.create calls; LastAttemptAt is the last one's time.
	Attempts      int        `firestore:"attempts,omitempty"`
	LastAttemptAt *time.Time `firestore:"last_attempt_at,omitempty"`
	// CreateFailed: batches.create refused the job; its tasks run online.
	CreateFailed    bool       `firestore:"create_failed,omitempty"`
	Polls           int        `firestore:"polls"`
	NextPollAt      *time.Time `firestore:"next_poll_at,omitempty"`
	CancelRequested bool       `firestore:"cancel_requested,omitempty"`
	CreatedAt       time.Time  `firestore:"created_at"`
	SubmittedAt     *time.Time `firestore:"submitted_at,omitempty"`
	PolledAt        *time.Time `firestore:"polled_at,omitempty"`
	FinishedAt      *time.Time `firestore:"finished_at,omitempty"`
	ExpireAt        *time.Time `firestore:"expire_at,omitempty"` // TTL, once done
}

// BatchMember is one task of a batch job.
type BatchMember struct {
	TaskID string `firestore:"task_id"`
	Tenant string `firestore:"tenant"`
	Replay int    `firestore:"replay"`
	Epoch  int64  `firestore:"epoch"`
	// ChargeUSD is the worst case of the task's request, charged to its tenant's budget (and the
	// project's) on ChargeDay (quota.Day) before it joined; what it spent takes its place when it
	// leaves the job.
	ChargeUSD float64 `firestore:"charge_usd,omitempty"`
	ChargeDay string  `firestore:"charge_day,omitempty"`
	// Tokens is the worst case of the task's request in tokens (its prompt and largest output),
	// held against its tenant's tpm while the job is open (BatchTasksInFlight).
	Tokens int64 `firestore:"tokens,omitempty"`
}

func (s *Store) batchJobs() *firestore.CollectionRef { return s.FS.Collection(BatchJobsCollection) }

// ClaimFunc decides, inside CreateBatchJob's transaction, whether a task joins the job; it claims
// it (changing t) when it does.
type ClaimFunc func(t *protocol.Task, now time.Time) bool

// CreateBatchJob writes job with the candidate tasks that claim accepts as its members, in one
// transaction: a task is never in a job without the job's document, nor claimed twice. Each
// candidate names its task and its charge; the rest of its member is the task's as claimed. The
// job's Deadline is its members' earliest not_before: when the first of them must leave
// batching. It returns the claimed tasks as written, or ErrNoChange when no candidate joined
// (nothing is written).
func (s *Store) CreateBatchJob(ctx context.Context, job *BatchJob, candidates []BatchMember, claim ClaimFunc) ([]*protocol.Task, error) {
	refs := make([]*firestore.DocumentRef, len(candidates))
	for i, c := range candidates {
		refs[i] = s.Tasks().Doc(c.TaskID)
	}
	jobRef := s.batchJobs().Doc(job.ID)
	var claimed []*protocol.Task
	err := s.FS.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		job.Members, job.Deadline, claimed = nil, time.Time{}, nil
		snaps, err := tx.GetAll(refs)
		if err != nil {
			return err
		}
		now := s.now()
		type write struct {
			ref *firestore.DocumentRef
			t   *protocol.Task
		}
		var writes []write
		var closed []string
		var freed []*protocol.Task
		for i, snap := range snaps {
			if !snap.Exists() {
				continue
			}
			t, changed, w, err := s.applySnap(snap, now, func(t *protocol.Task, now time.Time) error {
				if !claim(t, now) {
					return ErrNoChange
				}
				return nil
			})
			if err != nil {
				return err
			}
			closed = append(closed, w.closed...)
			if w.freed {
				freed = append(freed, t)
			}
			if changed {
				writes = append(writes, write{snap.Ref, t})
				claimed = append(claimed, t)
				m := candidates[i]
				m.Tenant, m.Replay, m.Epoch = t.Tenant, t.Replay, t.Lease.Epoch
				job.Members = append(job.Members, m)
				if t.NotBefore != nil && (job.Deadline.IsZero() || t.NotBefore.Before(job.Deadline)) {
					job.Deadline = *t.NotBefore
				}
			}
		}
		if len(writes) == 0 {
			return ErrNoChange
		}
		if err := s.freeSlotsTx(tx, freed, now); err != nil {
			return err
		}
		if err := s.writeSuperseded(tx, closed, "", now); err != nil {
			return err
		}
		job.CreatedAt, job.Open = now, true
		if err := tx.Create(jobRef, job); err != nil {
			return err
		}
		for _, w := range writes {
			if err := tx.Set(w.ref, w.t); err != nil {
				return err
			}
		}
		return nil
	}, s.txOptions()...)
	if errors.Is(err, ErrNoChange) {
		return nil, ErrNoChange
	}
	if err != nil {
		return nil, fmt.Errorf("create batch job %s: %w", job.ID, err)
	}
	return claimed, nil
}

// GetTasks reads tasks by id, in order; a missing one is absent from the result.
func (s *Store) GetTasks(ctx context.Context, ids []string) ([]*protocol.Task, error) {
	refs := make([]*firestore.DocumentRef, len(ids))
	for i, id := range ids {
		refs[i] = s.Tasks().Doc(id)
	}
	snaps, err := s.FS.GetAll(ctx, refs)
	if err != nil {
		return nil, fmt.Errorf("get %d tasks: %w", len(ids), err)
	}
	out := make([]*protocol.Task, 0, len(snaps))
	for _, snap := range snaps {
		if !snap.Exists() {
			continue
		}
		t, err := DecodeTask(snap)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// GetBatchJob reads one batch job.
func (s *Store) GetBatchJob(ctx context.Context, id string) (*BatchJob, error) {
	return getDoc(ctx, s.batchJobs().Doc(id), "batch job", decodeBatchJob)
}

func decodeBatchJob(snap *firestore.DocumentSnapshot) (*BatchJob, error) {
	var j BatchJob
	if err := snap.DataTo(&j); err != nil {
		return nil, fmt.Errorf("decode batch job %s: %w", snap.Ref.ID, err)
	}
	j.ID, j.UpdateTime = snap.Ref.ID, snap.UpdateTime
	return &j, nil
}

// OpenBatchJobs returns model's batch jobs that are not done, oldest first (store.Queries
// "open-batch-jobs").
func (s *Store) OpenBatchJobs(ctx context.Context, model string) ([]*BatchJob, error) {
	out, err := readAll(s.batchJobs().Where("model", "==", model).Where("open", "==", true).Documents(ctx),
		"open batch jobs of "+model, decodeBatchJob)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *BatchJob) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// BatchLoad is what a tenant's tasks hold in batch jobs not yet done: how many, and their
// requests' worst cases in tokens (BatchMember.Tokens).
type BatchLoad struct {
	Tasks  int
	Tokens int64
}

// BatchTasksInFlight sums each tenant's tasks in the batch jobs of every model that are not
// done (store.Queries "batch-tasks-in-flight").
func (s *Store) BatchTasksInFlight(ctx context.Context) (map[string]BatchLoad, error) {
	jobs, err := readAll(s.batchJobs().Where("open", "==", true).Documents(ctx), "open batch jobs", decodeBatchJob)
	if err != nil {
		return nil, err
	}
	n := map[string]BatchLoad{}
	for _, j := range jobs {
		for _, m := range j.Members {
			l := n[m.Tenant]
			l.Tasks++
			l.Tokens += m.Tokens
			n[m.Tenant] = l
		}
	}
	return n, nil
}

// MutateBatchJob reads batch job id in a transaction, applies fn (ErrNoChange writes nothing)
// and writes it back; a done job gets its TTL. It returns the job as written.
func (s *Store) MutateBatchJob(ctx context.Context, id string, fn func(j *BatchJob, now time.Time) error) (*BatchJob, error) {
	j, err := mutateDoc(ctx, s, s.batchJobs().Doc(id), decodeBatchJob, func(j *BatchJob, now time.Time) error {
		if err := fn(j, now); err != nil {
			return err
		}
		j.Open = j.State != BatchDone
		if !j.Open && j.ExpireAt == nil {
			exp := now.Add(s.Retention)
			j.ExpireAt = &exp
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mutate batch job %s: %w", id, err)
	}
	return j, nil
}

// BatchCandidate is a task waiting for a batch of its model, as the batcher's query reads it.
type BatchCandidate struct {
	ID, Tenant string
	CreatedAt  time.Time
	NotBefore  *time.Time
}

// BatchCandidates returns up to limit tasks waiting for a batch of model, oldest first, after
// the candidate after when it is not nil (store.Queries "batch-candidates"), reading only what
// the gathering needs.
func (s *Store) BatchCandidates(ctx context.Context, model string, limit int, after *BatchCandidate) ([]BatchCandidate, error) {
	q := s.Tasks().Where("batch_model", "==", model).Where("state", "==", string(task.StateQueued)).
		OrderBy("created_at", firestore.Asc).OrderBy(firestore.DocumentID, firestore.Asc)
	if after != nil {
		q = q.StartAfter(after.CreatedAt, after.ID)
	}
	q = q.Limit(limit).Select("created_at", "not_before", "tenant")
	return readAll(q.Documents(ctx), "batch candidates of "+model, func(snap *firestore.DocumentSnapshot) (BatchCandidate, error) {
		var c struct {
			Tenant    string     `firestore:"tenant"`
			CreatedAt time.Time  `firestore:"created_at"`
			NotBefore *time.Time `firestore:"not_before"`
		}
		if err := snap.DataTo(&c); err != nil {
			return BatchCandidate{}, fmt.Errorf("decode batch candidate %s: %w", snap.Ref.ID, err)
		}
		return BatchCandidate{ID: snap.Ref.ID, Tenant: c.Tenant, CreatedAt: c.CreatedAt, NotBefore: c.NotBefore}, nil
	})
}
