// Package batcher runs batch-mode tasks through the Gemini Batch API at the batch price
// (docs/cost.md). One leader per model, elected with a lease document like the sweeper's, gathers the
// tasks waiting for a batch of its model — each within its tenant's cap, its worst case reserved
// against the budgets as an online call's is, the job within a size in bytes Gemini accepts — and
// claims them under the job's lease in the same transaction that writes batch_jobs/{id}, each
// charged its worst case until the job answers; only then does it call batches.create, with that id
// as the job's display name, so a crash between the create and recording its answer finds the
// job again by display name instead of creating a second one. It polls each job with a bounded
// backoff, renews its tasks' lease, and once the job is done settles every task by its key under
// the outbox's rules (Tasks.SettleBatch: first output wins, never overwritten, a cancelled task
// never revived, usage always recorded). A job that failed, expired or was cancelled, and a
// request that failed inside it, send their tasks back: to the next job, or online when their
// deadline nears; a job still running when its first task must leave batching is cancelled. A
// create refused for its size is split: half the tasks go back to the next job.
package batcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/internal/leader"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/backoff"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Gemini is the Batch API (gemini.Client).
type Gemini interface {
	CreateBatch(ctx context.Context, model, displayName string, reqs []gemini.Request) (gemini.BatchJob, error)
	GetBatch(ctx context.Context, name string, reqs map[string]gemini.Request) (gemini.BatchJob, error)
	FindBatch(ctx context.Context, displayName string) (gemini.BatchJob, error)
	CancelBatch(ctx context.Context, name string) error
	DeleteBatch(ctx context.Context, name string) error
	// BatchSize is about what a request adds to a create's body.
	BatchSize(req gemini.Request) int
}

var _ Gemini = (*gemini.Client)(nil)

// Outcome is how one task's request in a batch job ended.
type Outcome struct {
	// Result is what the request spent (at the batch price) and, when Err is nil, its answer.
	Result gemini.Result
	// Err is the request's classified error (a *gemini.Error), nil with an answer.
	Err error
	// Lost means the job ended without answering the task (it failed, expired or was
	// cancelled): not the task's failure, so no attempt is counted.
	Lost bool
	// Online sends the task to run online rather than in the next job.
	Online bool
	// Fingerprint is the task's output cache key, when it may be cached.
	Fingerprint string
}

// Tasks is the task side of batching (worker.Handler): it renders a task's request, applies the
// model-call policy before a task joins a job, and settles or renews a member of a job under the
// job's lease.
type Tasks interface {
	BatchRequest(t *protocol.Task) (req gemini.Request, fingerprint string, err error)
	// BatchLimits are what tenant's tasks in batch jobs not yet done may hold at once (0: no
	// limit): tasks, its concurrency limit; the worst cases of their requests in tokens, its tpm.
	BatchLimits(ctx context.Context, tenant string) (store.BatchLoad, error)
	// Tokens is the worst case of req in tokens, as its tenant's tpm counts it.
	Tokens(req gemini.Request) int64
	// Admit applies the budgets to t before it joins a job of model with req: its tenant's daily
	// budget and the project's must hold req's worst case at the batch price, which Admit
	// reserves. The hold is nil without budgets. false keeps t out of the job: it waits for a
	// later one, or, refused by a budget, it is handed back to the worker, which applies the
	// budget policy as it does online.
	Admit(ctx context.Context, t *protocol.Task, req gemini.Request, model string) (*quota.Hold, bool)
	// SettleCharge puts what member m spent in the place of its charge; called once, when m
	// leaves its job.
	SettleCharge(m store.BatchMember, costUSD float64)
	// SettleBatch applies o to member m of job j and reports whether m is settled: out of the
	// job's lease, what it spent recorded.
	SettleBatch(ctx context.Context, j *store.BatchJob, m store.BatchMember, o Outcome) (bool, error)
	// RenewBatch extends the lease of member m of job id; false means m no longer runs in it.
	RenewBatch(ctx context.Context, id string, m store.BatchMember, ttl time.Duration) (bool, error)
}

// LeaderDoc is the leaders/{id} document of model's batcher.
func LeaderDoc(model string) string { return "batcher-" + strings.ReplaceAll(model, "/", "~") }

// Batcher runs the batch jobs of its models. Run it in every worker instance: only each model's
// leader works.
type Batcher struct {
	store   *store.Store
	gem     Gemini
	tasks   Tasks
	models  []string
	cfg     Config
	owner   string
	log     *slog.Logger
	metrics *obs.Metrics

	mu   sync.Mutex
	open map[string]obs.BatchJobs // by model, as the last pass of its leader saw it
}

// New returns a Batcher for models, leading as owner.
func New(s *store.Store, gem Gemini, tasks Tasks, models []string, cfg Config, owner string, log *slog.Logger, metrics *obs.Metrics) *Batcher {
	return &Batcher{store: s, gem: gem, tasks: tasks, models: models, cfg: cfg, owner: owner, log: log, metrics: metrics, open: map[string]obs.BatchJobs{}}
}

// Run leads every model it can until ctx ends, then gives its leaderships up.
func (b *Batcher) Run(ctx context.Context) {
	unregister, err := b.metrics.ObserveBatchJobs(b.observe)
	if err != nil {
		b.log.WarnContext(ctx, "batch job gauges not registered", "error", err)
	} else {
		defer func() { _ = unregister() }()
	}
	var wg sync.WaitGroup
	for _, m := range b.models {
		wg.Go(func() { b.lead(ctx, m) })
	}
	wg.Wait()
}

// observe reports the open jobs of the models this instance leads.
func (b *Batcher) observe() []obs.BatchJobs {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]obs.BatchJobs, 0, len(b.open))
	for _, j := range b.open {
		out = append(out, j)
	}
	return out
}

// lead runs model's passes while this instance holds its leadership, renewing it every third of
// its TTL during a pass: a pass that settles a large job takes longer than the lease. A lost
// renewal ends the pass.
func (b *Batcher) lead(ctx context.Context, model string) {
	log := b.log.With("model", model)
	loop := &leader.Loop{Name: "batcher", Interval: b.cfg.Interval, RenewEvery: b.cfg.LeaderTTL / 3, Log: log,
		Elector: b.store.Leader(LeaderDoc(model), b.owner, b.cfg.LeaderTTL),
		Left: func() {
			b.mu.Lock()
			delete(b.open, model)
			b.mu.Unlock()
		}}
	loop.Run(ctx, func(ctx context.Context, _ int64) time.Time {
		b.pass(ctx, log, model, func(context.Context) bool { return ctx.Err() == nil })
		return time.Time{}
	})
}

// pass advances model's open jobs, then gathers waiting tasks into a new one.
func (b *Batcher) pass(ctx context.Context, log *slog.Logger, model string, leading func(context.Context) bool) {
	jobs, err := b.store.OpenBatchJobs(ctx, model)
	if err != nil {
		if ctx.Err() == nil {
			log.WarnContext(ctx, "open batch jobs unreadable", "error", err)
		}
		return
	}
	seen := obs.BatchJobs{Model: model}
	for _, j := range jobs {
		if j.State == store.BatchDeleting {
			seen.Deleting++
			continue
		}
		if seen.Open == 0 {
			seen.OldestAge = b.store.Now().Sub(j.CreatedAt)
		}
		seen.Open++
	}
	b.mu.Lock()
	b.open[model] = seen
	b.mu.Unlock()
	for _, j := range jobs {
		if err := b.advance(ctx, log.With("batch_job", j.ID), j, leading); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "batch job not advanced; next pass", "batch_job", j.ID, "state", j.State, "error", err)
		}
	}
	if err := b.gather(ctx, log, model, leading); err != nil && ctx.Err() == nil {
		log.WarnContext(ctx, "batch not gathered; next pass", "error", err)
	}
}

// advance moves one open job on by its state.
func (b *Batcher) advance(ctx context.Context, log *slog.Logger, j *store.BatchJob, leading func(context.Context) bool) error {
	now := b.store.Now()
	if j.State != store.BatchSettling && j.State != store.BatchDeleting {
		if err := b.renew(ctx, j, now); err != nil {
			return err
		}
	}
	switch j.State {
	case store.BatchCreating:
		return b.reconcile(ctx, log, j, now, leading)
	case store.BatchSubmitted:
		if !j.CancelRequested && !now.Before(j.Deadline) {
			return b.cancel(ctx, log, j)
		}
		if j.NextPollAt != nil && now.Before(*j.NextPollAt) {
			return nil
		}
		return b.poll(ctx, log, j)
	case store.BatchSettling:
		return b.settle(ctx, log, j)
	case store.BatchDeleting:
		return b.deleteAtGemini(ctx, log, j)
	}
	return nil
}

// gather creates a job of the tasks waiting for model: when a full job's worth waits, or the
// oldest has waited Wait.
func (b *Batcher) gather(ctx context.Context, log *slog.Logger, model string, leading func(context.Context) bool) error {
	inFlight, err := b.store.BatchTasksInFlight(ctx)
	if err != nil {
		return err
	}
	tokens := map[string]int64{}
	for tenant, l := range inFlight {
		tokens[tenant] = l.Tokens
	}
	ids, limits, oldest, err := b.candidates(ctx, log, model, inFlight)
	if err != nil {
		return err
	}
	now := b.store.Now()
	if len(ids) == 0 || len(ids) < b.cfg.MaxTasks && now.Sub(oldest) < b.cfg.Wait {
		return nil
	}
	members, holds, err := b.admit(ctx, model, ids, limits, tokens)
	if err != nil || len(members) == 0 {
		return err
	}
	j := &store.BatchJob{ID: newJobID(), Model: model, State: store.BatchCreating, LeaseUntil: now.Add(b.cfg.LeaseTTL)}
	tasks, err := b.store.CreateBatchJob(ctx, j, members, func(t *protocol.Task, now time.Time) bool {
		return protocol.JoinBatch(t, j.ID, model, now, b.cfg.LeaseTTL)
	})
	claimed := make([]string, 0, len(tasks))
	for _, t := range tasks {
		claimed = append(claimed, t.ID)
	}
	if err != nil && !errors.Is(err, store.ErrNoChange) {
		claimed = b.written(ctx, j.ID)
	}
	keep(holds, claimed)
	if errors.Is(err, store.ErrNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.BatchClaimed)
	b.metrics.BatchJobCreated(ctx, model, len(tasks))
	log.InfoContext(ctx, "batch job claimed its tasks", "batch_job", j.ID, "tasks", len(tasks), "deadline", j.Deadline)
	return b.create(ctx, log.With("batch_job", j.ID), j, tasks, leading)
}

// maxCandidatePages bounds the pages of candidates one gathering reads past the tasks of tenants
// at their cap.
const maxCandidatePages = 5

// candidates returns, oldest first, up to MaxTasks tasks waiting for a batch of model whose time
// in batches lasts and whose tenant is under its limits — its tasks in jobs not yet done
// (inFlight, counted on here) fewer than its concurrency limit, and their requests' worst cases
// in tokens, this task's too, within its tpm —, the batch limits of their tenants, and
// when the oldest of them was created. It reads on past the tasks of tenants at their cap, up to
// maxCandidatePages pages, so that one tenant's backlog does not keep the others' tasks out of
// jobs. A tenant whose limits cannot be read has none of its tasks taken this time.
func (b *Batcher) candidates(ctx context.Context, log *slog.Logger, model string, inFlight map[string]store.BatchLoad) ([]string, map[string]store.BatchLoad, time.Time, error) {
	now := b.store.Now()
	var ids []string
	var oldest time.Time
	limits := map[string]store.BatchLoad{}
	var after *store.BatchCandidate
	for page := 0; page < maxCandidatePages && len(ids) < b.cfg.MaxTasks; page++ {
		cands, err := b.store.BatchCandidates(ctx, model, b.cfg.MaxTasks, after)
		if err != nil {
			return nil, nil, time.Time{}, err
		}
		for _, c := range cands {
			if len(ids) == b.cfg.MaxTasks {
				break
			}
			if c.NotBefore == nil || !now.Before(*c.NotBefore) {
				continue // its time in batches is over: the worker runs it online when it is due
			}
			limit, ok := limits[c.Tenant]
			if !ok {
				if limit, err = b.tasks.BatchLimits(ctx, c.Tenant); err != nil {
					log.WarnContext(ctx, "tenant limits unreadable; its tasks wait for a later batch job", "tenant", c.Tenant, "error", err)
					limit.Tasks = -1
				}
				limits[c.Tenant] = limit
			}
			load := inFlight[c.Tenant]
			if limit.Tasks < 0 || limit.Tasks > 0 && load.Tasks >= limit.Tasks {
				continue
			}
			if limit.Tokens > 0 {
				n, ok := b.tokensOf(ctx, c.ID)
				if !ok || load.Tokens+n > limit.Tokens {
					continue
				}
				load.Tokens += n
			}
			load.Tasks++
			inFlight[c.Tenant] = load
			ids = append(ids, c.ID)
			if oldest.IsZero() || c.CreatedAt.Before(oldest) {
				oldest = c.CreatedAt
			}
		}
		if len(cands) < b.cfg.MaxTasks {
			break
		}
		after = &cands[len(cands)-1]
	}
	return ids, limits, oldest, nil
}

// tokensOf reads task id and returns the worst case of its request in tokens; false when it
// cannot (the task is left for a later job). Only the tasks of a tenant with a tpm pay this read.
func (b *Batcher) tokensOf(ctx context.Context, id string) (int64, bool) {
	t, err := b.store.GetTask(ctx, id)
	if err != nil {
		return 0, false
	}
	req, _, err := b.tasks.BatchRequest(t)
	if err != nil {
		return 0, true // admit fails it when the job is created
	}
	return b.tasks.Tokens(req), true
}

// admit picks, oldest first, the tasks of ids that join the next job of model: while their
// requests fit in MaxBytes, those whose tenant's tpm (limits) has room for their worst case in
// tokens beside what its tasks hold in open jobs and in this one (tokens, counted on here), and
// that Tasks.Admit lets through, their worst case reserved against the budgets. It returns them
// as members, charged, with their holds: the caller keeps the hold of each task the job claims
// and releases the others'. A task whose request cannot be rendered joins uncharged, to be
// failed when the job is created.
func (b *Batcher) admit(ctx context.Context, model string, ids []string, limits map[string]store.BatchLoad, tokens map[string]int64) ([]store.BatchMember, map[string]*quota.Hold, error) {
	tasks, err := b.store.GetTasks(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	var members []store.BatchMember
	holds := map[string]*quota.Hold{}
	size := 0
	for _, t := range tasks {
		if t.State != task.StateQueued || t.BatchModel != model {
			continue
		}
		m := store.BatchMember{TaskID: t.ID}
		req, _, err := b.tasks.BatchRequest(t)
		if err == nil {
			n := b.gem.BatchSize(req)
			if size+n > b.cfg.MaxBytes && len(members) > 0 {
				break // the next job takes it, and those after it
			}
			m.Tokens = b.tasks.Tokens(req)
			if tpm := limits[t.Tenant].Tokens; tpm > 0 && tokens[t.Tenant]+m.Tokens > tpm {
				continue // a later job, once the tenant's open jobs are done
			}
			hold, ok := b.tasks.Admit(ctx, t, req, model)
			if !ok {
				continue
			}
			tokens[t.Tenant] += m.Tokens
			if hold != nil {
				c := hold.Charge()
				m.ChargeUSD, m.ChargeDay = c.USD, c.Day
				holds[t.ID] = hold
			}
			size += n
		}
		members = append(members, m)
	}
	return members, holds, nil
}

// keep keeps the hold of each task a job claimed (by id), now its charge, and releases the
// others'.
func keep(holds map[string]*quota.Hold, claimed []string) {
	for _, id := range claimed {
		if h, ok := holds[id]; ok {
			h.Keep()
			delete(holds, id)
		}
	}
	for _, h := range holds {
		h.Settle(0)
	}
}

// written returns the members of job id as a claim whose transaction failed may have written
// it all the same (its commit's outcome unknown): the next pass carries such a job on, and its
// members' charges must be kept for their settlement to make sense. None when it is not there,
// or cannot be read.
func (b *Batcher) written(ctx context.Context, id string) []string {
	j, err := b.store.GetBatchJob(ctx, id)
	if err != nil {
		return nil
	}
	return memberIDs(j)
}

// creatingGrace is how long a job found creating is left to the leader that may still be
// calling batches.create for it: a leadership and a call.
func (b *Batcher) creatingGrace() time.Duration { return b.cfg.LeaderTTL + b.cfg.CallTimeout }

// reconcile finishes a job found creating: the job its creator may have made is looked up by
// display name (the document's id); only when there is none, and its creator can no longer be
// calling, is it created.
func (b *Batcher) reconcile(ctx context.Context, log *slog.Logger, j *store.BatchJob, now time.Time, leading func(context.Context) bool) error {
	cctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	found, err := b.gem.FindBatch(cctx, j.ID)
	switch {
	case err == nil:
		log.InfoContext(ctx, "batch job found by display name; recorded, not created again", "gemini_name", found.Name)
		return b.submitted(ctx, j.ID, found.Name)
	case !errors.Is(err, gemini.ErrBatchNotFound):
		return err
	}
	last := j.CreatedAt
	if j.LastAttemptAt != nil {
		last = *j.LastAttemptAt
	}
	if now.Sub(last) < b.creatingGrace() {
		return nil
	}
	tasks, err := b.store.GetTasks(ctx, memberIDs(j))
	if err != nil {
		return err
	}
	return b.create(ctx, log, j, tasks, leading)
}

// maxCreateAttempts bounds the batches.create calls of a job that fails transiently.
const maxCreateAttempts = 5

// create renders the requests of the members the job still holds and calls batches.create,
// then records the job's name. A task whose request cannot be rendered fails at once. A job
// refused for its size is split (split); any other refused create sends the tasks online.
func (b *Batcher) create(ctx context.Context, log *slog.Logger, j *store.BatchJob, tasks []*protocol.Task, leading func(context.Context) bool) error {
	reqs, _, err := b.requests(ctx, log, j, held(tasks, j))
	if err != nil {
		return err
	}
	if len(reqs) == 0 {
		return b.finish(ctx, log, j, nil)
	}
	if !leading(ctx) {
		return errors.New("no longer leading; the next leader reconciles the job")
	}
	cctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	job, err := b.gem.CreateBatch(cctx, j.Model, j.ID, reqs)
	if errors.Is(err, gemini.ErrBatchTooLarge) && len(reqs) > 1 {
		log.WarnContext(ctx, "batch job refused for its size; split", "requests", len(reqs), "error", err)
		return b.split(ctx, log, j, reqs, tasks, leading)
	}
	if err != nil {
		refused := permanent(err)
		_, merr := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, now time.Time) error {
			if j.State != store.BatchCreating {
				return store.ErrNoChange
			}
			j.Attempts++
			j.LastAttemptAt = &now
			if refused || j.Attempts >= maxCreateAttempts {
				j.State, j.CreateFailed = store.BatchSettling, true
			}
			return nil
		})
		return errors.Join(err, merr)
	}
	crashpoint.Hit(crashpoint.BatchCreated)
	if err := b.submitted(ctx, j.ID, job.Name); err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.BatchRecorded)
	log.InfoContext(ctx, "batch job created", "gemini_name", job.Name, "requests", len(reqs))
	return nil
}

// split keeps the first half of reqs in job j and sends the tasks of the others back to wait
// for the next job (no attempt counted: the job, not the request, was refused), then creates j
// again. The tasks are sent back before they leave the job's document, so that a crash between
// the two leaves none held by a job that lists it not; create renders only the members the job
// still holds.
func (b *Batcher) split(ctx context.Context, log *slog.Logger, j *store.BatchJob, reqs []gemini.Request, tasks []*protocol.Task, leading func(context.Context) bool) error {
	leave := map[string]bool{}
	for _, r := range reqs[len(reqs)/2:] {
		leave[r.TaskID] = true
	}
	for _, m := range j.Members {
		if !leave[m.TaskID] {
			continue
		}
		if _, err := b.tasks.SettleBatch(ctx, j, m, Outcome{Lost: true}); err != nil {
			return err
		}
	}
	var left []store.BatchMember
	kept, err := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, _ time.Time) error {
		if j.State != store.BatchCreating {
			return store.ErrNoChange
		}
		left = nil
		j.Members = slices.DeleteFunc(j.Members, func(m store.BatchMember) bool {
			if leave[m.TaskID] {
				left = append(left, m)
				return true
			}
			return false
		})
		return nil
	})
	if err != nil {
		return err
	}
	for _, m := range left {
		b.tasks.SettleCharge(m, 0)
	}
	if kept.State != store.BatchCreating {
		return nil
	}
	return b.create(ctx, log, kept, tasks, leading)
}

// held returns the tasks the job holds under its lease: the ones it may still send. A task sent
// back, cancelled or taken by another job since is not.
func held(tasks []*protocol.Task, j *store.BatchJob) []*protocol.Task {
	epochs := map[string]int64{}
	for _, m := range j.Members {
		epochs[m.TaskID] = m.Epoch
	}
	owner := protocol.BatchOwner(j.ID)
	out := make([]*protocol.Task, 0, len(tasks))
	for _, t := range tasks {
		if e, ok := epochs[t.ID]; ok && t.State == task.StateRunning && t.Lease.Owner == owner && t.Lease.Epoch == e {
			out = append(out, t)
		}
	}
	return out
}

// permanent reports whether Gemini refused a call outright (a 4xx other than 408 and 429).
func permanent(err error) bool {
	var apiErr genai.APIError
	return errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 &&
		apiErr.Code != http.StatusRequestTimeout && apiErr.Code != http.StatusTooManyRequests
}

// requests renders the request of every member still in the job, keyed by task id, with its
// cache fingerprint. A member whose request cannot be rendered is failed (settled) now.
func (b *Batcher) requests(ctx context.Context, log *slog.Logger, j *store.BatchJob, tasks []*protocol.Task) ([]gemini.Request, map[string]string, error) {
	byID := map[string]*protocol.Task{}
	for _, t := range tasks {
		byID[t.ID] = t
	}
	var reqs []gemini.Request
	fps := map[string]string{}
	for _, m := range j.Members {
		t, ok := byID[m.TaskID]
		if !ok {
			continue
		}
		req, fp, err := b.tasks.BatchRequest(t)
		if err != nil {
			log.ErrorContext(ctx, "cannot render a batch task's request; failed", "task_id", t.ID, "error", err)
			if _, serr := b.tasks.SettleBatch(ctx, j, m, Outcome{Err: &gemini.Error{Class: gemini.Permanent, Err: err}}); serr != nil {
				return nil, nil, serr
			}
			continue
		}
		reqs = append(reqs, req)
		fps[t.ID] = fp
	}
	return reqs, fps, nil
}

// submitted records the Gemini name of a job that was creating.
func (b *Batcher) submitted(ctx context.Context, id, name string) error {
	_, err := b.store.MutateBatchJob(ctx, id, func(j *store.BatchJob, now time.Time) error {
		if j.State != store.BatchCreating {
			return store.ErrNoChange
		}
		next := now.Add(b.cfg.Interval)
		j.State, j.GeminiName, j.SubmittedAt, j.NextPollAt, j.Polls = store.BatchSubmitted, name, &now, &next, 0
		return nil
	})
	return err
}

// renew extends the batch lease of the job's tasks once half of it is spent.
func (b *Batcher) renew(ctx context.Context, j *store.BatchJob, now time.Time) error {
	if j.LeaseUntil.Sub(now) > b.cfg.LeaseTTL/2 {
		return nil
	}
	var mu sync.Mutex
	var errs []error
	b.each(j, func(m store.BatchMember) {
		if _, err := b.tasks.RenewBatch(ctx, j.ID, m, b.cfg.LeaseTTL); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("renew the batch lease: %w", err)
	}
	_, err := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, now time.Time) error {
		j.LeaseUntil = now.Add(b.cfg.LeaseTTL)
		return nil
	})
	return err
}

// cancel asks Gemini to cancel a job still running when its first task must leave batching.
func (b *Batcher) cancel(ctx context.Context, log *slog.Logger, j *store.BatchJob) error {
	cctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	if err := b.gem.CancelBatch(cctx, j.GeminiName); err != nil && !permanent(err) {
		return err
	}
	log.WarnContext(ctx, "batch job past its deadline; cancelled so its tasks can run online", "deadline", j.Deadline)
	_, err := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, now time.Time) error {
		j.CancelRequested, j.NextPollAt = true, &now
		return nil
	})
	return err
}

// poll reads the job from Gemini and records what it says, backing off while it runs; a done
// job is settled at once.
func (b *Batcher) poll(ctx context.Context, log *slog.Logger, j *store.BatchJob) error {
	cctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	job, err := b.gem.GetBatch(cctx, j.GeminiName, nil)
	if errors.Is(err, gemini.ErrBatchNotFound) {
		job, err = gemini.BatchJob{Name: j.GeminiName, State: gemini.BatchCancelled}, nil
	}
	if err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.BatchMidPoll)
	updated, err := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, now time.Time) error {
		if j.State != store.BatchSubmitted {
			return store.ErrNoChange
		}
		j.Polls++
		j.PolledAt, j.GeminiState = &now, job.State
		if job.Done() {
			j.State = store.BatchSettling
			return nil
		}
		next := now.Add(b.pollBackoff(j.Polls))
		j.NextPollAt = &next
		return nil
	})
	if err != nil {
		return err
	}
	if updated.State != store.BatchSettling {
		return nil
	}
	log.InfoContext(ctx, "batch job done", "gemini_state", job.State, "polls", updated.Polls)
	return b.settle(ctx, log, updated)
}

// pollBackoff is the wait after poll n: doubling from Interval, capped at PollMax.
func (b *Batcher) pollBackoff(n int) time.Duration {
	return backoff.Policy{Base: b.cfg.Interval, Max: b.cfg.PollMax}.Ceiling(n)
}

// settle applies the done job to each of its tasks, then marks it done and deletes the Gemini
// job. A task it could not settle keeps the job settling for the next pass: every step is
// idempotent (a persisted output is recognised by its epoch, a sent-back task is no longer
// under the job's lease).
func (b *Batcher) settle(ctx context.Context, log *slog.Logger, j *store.BatchJob) error {
	tasks, err := b.store.GetTasks(ctx, memberIDs(j))
	if err != nil {
		return err
	}
	reqs := map[string]gemini.Request{}
	fps := map[string]string{}
	if j.GeminiState == gemini.BatchSucceeded {
		list, f, err := b.requests(ctx, log, j, live(tasks, j))
		if err != nil {
			return err
		}
		for _, r := range list {
			reqs[r.TaskID] = r
		}
		fps = f
	}
	results := map[string]gemini.BatchResult{}
	if j.GeminiState == gemini.BatchSucceeded {
		cctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
		job, err := b.gem.GetBatch(cctx, j.GeminiName, reqs)
		cancel()
		if err != nil && !errors.Is(err, gemini.ErrBatchNotFound) {
			return err
		}
		for _, r := range job.Results {
			results[r.Key] = r
		}
	}
	spent := map[string]float64{}
	for key, r := range results {
		spent[key] = r.Result.CostUSD
	}
	var unsettled atomic.Int64
	var once sync.Once
	b.each(j, func(m store.BatchMember) {
		o := Outcome{Lost: true, Online: j.CreateFailed}
		if r, ok := results[m.TaskID]; ok {
			o = Outcome{Result: r.Result, Err: r.Err, Fingerprint: fps[m.TaskID]}
		}
		ok, err := b.tasks.SettleBatch(ctx, j, m, o)
		if err != nil || !ok {
			unsettled.Add(1)
			log.WarnContext(ctx, "batch task not settled; next pass", "task_id", m.TaskID, "error", err)
		}
		once.Do(func() { crashpoint.Hit(crashpoint.BatchPersisting) })
	})
	if n := unsettled.Load(); n > 0 {
		return fmt.Errorf("%d tasks of the job are not settled", n)
	}
	return b.finish(ctx, log, j, spent)
}

// live returns the tasks still running in the job: the ones whose results are still wanted
// for rendering their validators.
func live(tasks []*protocol.Task, j *store.BatchJob) []*protocol.Task {
	out := make([]*protocol.Task, 0, len(tasks))
	for _, t := range tasks {
		if t.BatchJob == j.ID {
			out = append(out, t)
		}
	}
	return out
}

// finish marks the job settled and settles its members' charges with what each spent (by task
// id), once, then deletes the Gemini job: its results are no longer needed, and it holds every
// member's input and output. A job Gemini never made is done at once.
func (b *Batcher) finish(ctx context.Context, log *slog.Logger, j *store.BatchJob, spent map[string]float64) error {
	next := store.BatchDeleting
	if j.GeminiName == "" {
		next = store.BatchDone
	}
	finished := false // by this call: its members' charges are settled here, once
	done, err := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, now time.Time) error {
		if finished = j.State != store.BatchDone && j.State != store.BatchDeleting; !finished {
			return store.ErrNoChange
		}
		j.State, j.FinishedAt = next, &now
		return nil
	})
	if err != nil {
		return err
	}
	if finished {
		for _, m := range done.Members {
			b.tasks.SettleCharge(m, spent[m.TaskID])
		}
	}
	log.InfoContext(ctx, "batch job settled", "tasks", len(done.Members), "gemini_state", done.GeminiState)
	if done.State != store.BatchDeleting {
		return nil
	}
	return b.deleteAtGemini(ctx, log, done)
}

// deleteAtGemini deletes a settled job at Gemini (one Gemini no longer knows is gone already), then
// marks it done. A failed delete leaves it deleting, counted by genbox.batch.jobs_deleting: every
// pass tries again, and logs each failure, until Gemini answers — a tenant's erase of a member
// relies on it.
func (b *Batcher) deleteAtGemini(ctx context.Context, log *slog.Logger, j *store.BatchJob) error {
	cctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	if err := b.gem.DeleteBatch(cctx, j.GeminiName); err != nil && !errors.Is(err, gemini.ErrBatchNotFound) {
		return fmt.Errorf("settled job still at Gemini with its tasks' inputs and outputs: %w", err)
	}
	if _, err := b.store.MutateBatchJob(ctx, j.ID, func(j *store.BatchJob, now time.Time) error {
		if j.State != store.BatchDeleting {
			return store.ErrNoChange
		}
		j.State = store.BatchDone
		return nil
	}); err != nil {
		return err
	}
	log.InfoContext(ctx, "batch job deleted from Gemini", "gemini_name", j.GeminiName)
	return nil
}

// memberWorkers bounds the tasks of a job written at once.
const memberWorkers = 8

// each runs fn for every member of j, memberWorkers at a time.
func (b *Batcher) each(j *store.BatchJob, fn func(m store.BatchMember)) {
	sem := make(chan struct{}, memberWorkers)
	var wg sync.WaitGroup
	for _, m := range j.Members {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(m)
		})
	}
	wg.Wait()
}

func memberIDs(j *store.BatchJob) []string {
	ids := make([]string, len(j.Members))
	for i, m := range j.Members {
		ids[i] = m.TaskID
	}
	return ids
}

// newJobID is a batch job id of 96 random bits, and the Gemini job's display name.
func newJobID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "bj" + hex.EncodeToString(b[:])
}
