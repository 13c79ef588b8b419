package main

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/protocol"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// batchWorst is the worst case of one summarize task of batchEnv at the batch price: its prompt
// (about 60 tokens) and the family's 1024 output tokens at m's batch rates ($0.5 and $1 per
// million), a little over $0.001.
const batchWorst = 0.00106

// A tenant held to a daily budget of two batch tasks' worst cases submits six: the job takes
// what the budget holds, the others fail with kind budget as online tasks do under the fail
// policy, and Gemini bills nothing past the budget.
func TestBatchTasksHeldToTheTenantsDailyBudget(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	s.fake.SetBatchPlan("m", geminitest.BatchPlan{Running: 3 * time.Second})
	const budget = 2.4 * batchWorst
	tasks := ids("budget", 6)
	s.submitBatch(t, 0, tasks...)
	testenv.Start(t, run, s.batchEnv("GENBOX_DEFAULT_DAILY_BUDGET_USD", "0.0025", "GENBOX_BUDGET_POLICY", "fail"))
	var succeeded, refused int
	waitFor(t, "every task ended", time.Minute, func() bool {
		succeeded, refused = 0, 0
		for _, id := range tasks {
			switch got := s.get(t, id); {
			case got.State == task.StateSucceeded:
				succeeded++
			case got.State == task.StateFailed && got.Error != nil && got.Error.Kind == task.KindBudget:
				refused++
			}
		}
		return succeeded+refused == len(tasks)
	})
	if succeeded == 0 || refused == 0 {
		t.Errorf("%d tasks succeeded and %d failed on the budget, want some of each: the budget holds two", succeeded, refused)
	}
	if billed := s.fake.Ledger().CostUSD(batchPricing); billed > budget {
		t.Errorf("Gemini billed $%.6f, past the budget of $%.6f", billed, budget)
	}
}

// Batch tasks already waiting for a job when the project's daily budget is spent do not join
// one, nor does a batch task regenerated then: they wait on the budget, as online tasks do, and
// no job is created.
func TestBatchTasksWaitWhenTheProjectBudgetIsSpent(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	ctx := context.Background()
	if err := s.store.AddSpend(ctx, quota.SpendFlush{Tenant: quota.ProjectCounter, Day: quota.Day(time.Now()), Origin: "test", Seq: 1, USD: 1}); err != nil {
		t.Fatal(err)
	}
	held := ids("project", 3)
	s.holdForBatch(t, "tenant-a", shortInput, held...)
	if err := s.store.CreateTask(ctx, &protocol.Task{
		ID: "project-regenerated", Tenant: "tenant-a", Family: "summarize", Variant: "default", Input: "The nightly report says little.",
		State: task.StateDead, Mode: task.ModeBatch, Error: &protocol.TaskError{Kind: task.KindTransient, Message: "attempts exhausted"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.MutateTask(ctx, "project-regenerated", func(t *protocol.Task, _ time.Time) error {
		t.Regenerate() // what the dead letter's Regenerate does
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: "project-regenerated"}); err != nil {
		t.Fatal(err)
	}
	tasks := append(held, "project-regenerated")
	testenv.Start(t, run, s.batchEnv("GENBOX_PROJECT_DAILY_BUDGET_USD", "1"))
	waitFor(t, "every task waiting on the budget", time.Minute, func() bool {
		for _, id := range tasks {
			if got := s.get(t, id); got.State != task.StateWaiting || got.Error == nil || got.Error.Kind != task.KindBudget {
				return false
			}
		}
		return true
	})
	snaps, err := s.store.FS.Collection(store.BatchJobsCollection).Documents(ctx).GetAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 0 || len(s.fake.Ledger().Batches) != 0 {
		t.Errorf("%d batch_jobs documents and %d Gemini batch jobs, want none past the project's budget", len(snaps), len(s.fake.Ledger().Batches))
	}
}

// A tenant's concurrency cap bounds its tasks in batch jobs not yet done: with a cap of two,
// its six tasks run in jobs of two at most, one job at a time, each at the batch price. Its
// backlog, older than another tenant's tasks, does not keep those out of the first job.
func TestBatchTasksHeldToTheTenantsCap(t *testing.T) {
	t.Parallel()
	_, jobs := runLimitedBatch(t, store.Limits{Concurrency: 2}, "under its cap")
	// When each job was created, tenant-a's tasks in the jobs still open — it among them — were
	// within its cap.
	for _, j := range jobs {
		n := 0
		for _, k := range jobs {
			if !k.CreatedAt.After(j.CreatedAt) && k.FinishedAt.After(j.CreatedAt) {
				n += members(k, "tenant-a")
			}
		}
		if n > 2 {
			t.Errorf("when batch job %s was created, %d of tenant-a's tasks were in open jobs, over its cap of 2", j.ID, n)
		}
	}
}

// A tenant's tpm bounds the tokens its tasks hold in batch jobs not yet done — each request's
// worst case, its prompt and the family's 1024 output tokens, about 1,080 — as its share of the
// model's quota, which Gemini counts for batch jobs in tokens enqueued: with a tpm of 2,500 its
// six tasks run two at a time. Its backlog does not keep another tenant's tasks out of the first
// job, and the batch requests take nothing from its online rpm/tpm window (Gemini's batch quota
// is its own).
func TestBatchTasksHeldToTheTenantsTPM(t *testing.T) {
	t.Parallel()
	const tpm = 2500
	s, jobs := runLimitedBatch(t, store.Limits{TPM: tpm}, "within its tpm")
	for _, j := range jobs {
		var held int64
		for _, k := range jobs {
			if !k.CreatedAt.After(j.CreatedAt) && k.FinishedAt.After(j.CreatedAt) {
				for _, m := range k.Members {
					if m.Tokens <= 0 {
						t.Errorf("member %s of batch job %s holds %d tokens, want its worst case", m.TaskID, k.ID, m.Tokens)
					}
					if m.Tenant == "tenant-a" {
						held += m.Tokens
					}
				}
			}
		}
		if held > tpm {
			t.Errorf("when batch job %s was created, tenant-a's tasks in open jobs held %d tokens, over its tpm of %d", j.ID, held, tpm)
		}
	}
	if _, err := s.store.FS.Collection(store.TenantRatesCollection).Doc("tenant-a").Get(context.Background()); status.Code(err) != codes.NotFound {
		t.Errorf("tenant-a's online rate window: %v, want none: batch requests are not taken from it", err)
	}
}

// runLimitedBatch runs six batch-mode tasks of tenant-a, whose limits are l, and two of tenant-b
// through a worker making jobs of three, and checks every task is billed once at the batch price
// and the first job holds two of tenant-a's tasks (what l allows it), then one of tenant-b's: an
// older backlog does not keep another tenant out. It returns the stack and the jobs made.
func runLimitedBatch(t *testing.T, l store.Limits, allows string) (*stack, []*store.BatchJob) {
	t.Helper()
	s := newStack(t, 0)
	s.store.Secrets = testenv.Secrets()
	if _, err := s.store.CreateTenant(context.Background(), "tenant-a", l, "whsec"); err != nil {
		t.Fatal(err)
	}
	s.fake.SetBatchPlan("m", geminitest.BatchPlan{Running: 300 * time.Millisecond})
	limited, other := ids("limited", 6), ids("other", 2)
	s.holdForBatch(t, "tenant-a", shortInput, limited...)
	s.holdForBatch(t, "tenant-b", shortInput, other...)
	testenv.Start(t, run, s.batchEnv("GENBOX_BATCH_MAX_TASKS", "3"))
	tasks := append(limited, other...)
	s.waitState(t, time.Minute, task.StateSucceeded, tasks...)
	s.checkBilledOnce(t, geminitest.TierBatch, tasks...)
	jobs := s.batchJobs(t)
	inFirst := map[string]int{}
	for _, m := range jobs[0].Members {
		inFirst[m.Tenant]++
	}
	if want := map[string]int{"tenant-a": 2, "tenant-b": 1}; !maps.Equal(inFirst, want) {
		t.Errorf("the first job holds %v tasks by tenant, want %v: tenant-a's two %s, then tenant-b's", inFirst, want, allows)
	}
	return s, jobs
}

// members counts the tasks of tenant in job j.
func members(j *store.BatchJob, tenant string) int {
	n := 0
	for _, m := range j.Members {
		if m.Tenant == tenant {
			n++
		}
	}
	return n
}

// shortInput is the input of a task named id.
func shortInput(id string) string { return "The nightly report " + id + " says little." }

// holdForBatch writes batch-mode tasks of tenant, each with input(id), as the worker leaves them for the
// batcher: queued, waiting for a batch of m until an hour from now. One pass finds them all.
func (s *stack) holdForBatch(t *testing.T, tenant string, input func(id string) string, ids ...string) {
	t.Helper()
	until := time.Now().Add(time.Hour)
	for _, id := range ids {
		if err := s.store.CreateTask(context.Background(), &protocol.Task{
			ID: id, Tenant: tenant, Family: "summarize", Variant: "default", Input: input(id),
			State: task.StateQueued, Mode: task.ModeBatch, BatchModel: "m", NotBefore: &until,
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// longInput is a task input of about 2 KB.
func longInput(id string) string { return id + strings.Repeat(" The nightly report says little.", 64) }

// A job is capped in bytes as well as in tasks: six requests of about 2 KB under a cap of 5 KB
// make several jobs, none of them refused, and every task is billed once at the batch price.
func TestBatchJobsAreCappedInBytes(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	tasks := ids("bytes", 6)
	s.holdForBatch(t, "tenant-a", longInput, tasks...)
	testenv.Start(t, run, s.batchEnv("GENBOX_BATCH_MAX_BYTES", "5000"))
	s.waitState(t, time.Minute, task.StateSucceeded, tasks...)
	s.checkBilledOnce(t, geminitest.TierBatch, tasks...)
	l := s.fake.Ledger()
	if len(l.Batches) < 2 || l.BatchesRefused != 0 {
		t.Errorf("%d batch jobs, %d creates refused: want the six requests in several jobs, none refused", len(l.Batches), l.BatchesRefused)
	}
}

// A create Gemini refuses for its size is split and created again: the requests run in smaller
// jobs at the batch price instead of going online at twice the price.
func TestBatchJobRefusedForItsSizeIsSplit(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	s.fake.SetBatchByteLimit(6000)
	tasks := ids("split", 6)
	s.holdForBatch(t, "tenant-a", longInput, tasks...)
	testenv.Start(t, run, s.batchEnv())
	s.waitState(t, time.Minute, task.StateSucceeded, tasks...)
	s.checkBilledOnce(t, geminitest.TierBatch, tasks...)
	if l := s.fake.Ledger(); l.BatchesRefused == 0 || len(l.Batches) < 2 {
		t.Errorf("%d creates refused, %d batch jobs: want the job refused for its size, then split", l.BatchesRefused, len(l.Batches))
	}
	for _, j := range s.batchJobs(t) {
		if j.CreateFailed {
			t.Errorf("batch job %s gave up after a refused create; its tasks went online", j.ID)
		}
	}
}
