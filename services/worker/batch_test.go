package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"cloud.google.com/go/firestore"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/internal/worker/crashpoint"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// batchEnv is the worker's environment with a quick batcher: passes every 100 ms, a job
// gathered after half a second, and a model priced so that batch costs are not vacuous.
func (s *stack) batchEnv(extra ...string) map[string]string {
	return s.env(append([]string{
		"GENBOX_BATCH_INTERVAL", "100ms", "GENBOX_BATCH_WAIT", "500ms", "GENBOX_BATCH_POLL_MAX", "200ms",
		"GENBOX_BATCH_LEASE_TTL", "3s", "GENBOX_BATCH_LEADER_TTL", "1s", "GENBOX_BATCH_CALL_TIMEOUT", "5s",
		"GENBOX_PRICES", "m=1/2",
	}, extra...)...)
}

// batchPricing is what batchEnv prices model m at.
var batchPricing = func() gemini.Pricing {
	p, err := gemini.ParsePrices("m=1/2")
	if err != nil {
		panic(err)
	}
	return gemini.Pricing{Prices: p}
}()

// submitBatch writes and nudges a batch-mode task of each id; runBefore > 0 sets their
// run_before.
func (s *stack) submitBatch(t *testing.T, runBefore time.Duration, ids ...string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		grace := time.Now().Add(time.Second)
		doc := &protocol.Task{
			ID: id, Tenant: "tenant-a", Family: "summarize", Variant: "default", Input: "The nightly report " + id + " says little.",
			State: task.StateQueued, CallbackURL: "https://app.example/hook", NudgeAt: &grace, Mode: task.ModeBatch,
		}
		if runBefore > 0 {
			rb := time.Now().Add(runBefore)
			doc.RunBefore = &rb
		}
		if err := s.store.CreateTask(ctx, doc); err != nil {
			t.Fatal(err)
		}
		if _, err := s.pub.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: id}); err != nil {
			t.Fatal(err)
		}
	}
}

// runBatched submits tasks for batching (runBefore as submitBatch), runs the service with
// batchEnv(extra...) and waits until every task has succeeded, each billed once at tier.
func (s *stack) runBatched(t *testing.T, tasks []string, runBefore time.Duration, tier string, extra ...string) {
	t.Helper()
	s.submitBatch(t, runBefore, tasks...)
	testenv.Start(t, run, s.batchEnv(extra...))
	s.waitState(t, time.Minute, task.StateSucceeded, tasks...)
	s.checkBilledOnce(t, tier, tasks...)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// checkBilledOnce asserts every task was billed exactly once, at tier, and records the cost of
// that bill.
func (s *stack) checkBilledOnce(t *testing.T, tier string, ids ...string) {
	t.Helper()
	l := s.fake.Ledger()
	for _, id := range ids {
		bills := l.BillsFor(id)
		got := s.get(t, id)
		if len(bills) != 1 || bills[0].Tier != tier {
			var tiers []string
			for _, b := range bills {
				tiers = append(tiers, b.Tier+" in "+b.Request.Batch)
			}
			t.Errorf("%s: billed %d times %v, want once at the %s tier", id, len(bills), tiers, tier)
			continue
		}
		if want := bills[0].CostUSD(batchPricing); want == 0 || math.Abs(got.CostUSD-want) > 1e-12 || got.Usage != bills[0].Usage {
			t.Errorf("%s: cost %g usage %+v, the invoice %g %+v", id, got.CostUSD, got.Usage, want, bills[0].Usage)
		}
	}
}

// batchJobs waits until every batch_jobs document of the stack is settled and returns them in
// creation order, checking the one-job-per-batch rule: each was created at Gemini exactly once
// (by display name, its id), and every Gemini job has its document.
func (s *stack) batchJobs(t *testing.T) []*store.BatchJob {
	t.Helper()
	ctx := context.Background()
	var jobs []*store.BatchJob
	waitFor(t, "every batch job settled", 30*time.Second, func() bool {
		snaps, err := s.store.FS.Collection(store.BatchJobsCollection).OrderBy("created_at", firestore.Asc).Documents(ctx).GetAll()
		if err != nil {
			t.Fatal(err)
		}
		jobs = jobs[:0]
		for _, snap := range snaps {
			j, err := s.store.GetBatchJob(ctx, snap.Ref.ID)
			if err != nil {
				t.Fatal(err)
			}
			if j.State != store.BatchDone {
				return false
			}
			jobs = append(jobs, j)
		}
		return true
	})
	l := s.fake.Ledger()
	for _, j := range jobs {
		if n := len(l.BatchesNamed(j.ID)); n != 1 {
			t.Errorf("batch job %s was created %d times at Gemini", j.ID, n)
		}
	}
	if len(l.Batches) != len(jobs) {
		t.Errorf("Gemini ran %d batch jobs for %d batch_jobs documents", len(l.Batches), len(jobs))
	}
	return jobs
}

// jobsOf returns the jobs task id ran in.
func jobsOf(jobs []*store.BatchJob, id string) []*store.BatchJob {
	var out []*store.BatchJob
	for _, j := range jobs {
		for _, m := range j.Members {
			if m.TaskID == id {
				out = append(out, j)
			}
		}
	}
	return out
}

func TestBatchTasksRunThroughOneJob(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	s.fake.SetBatchPlan("m", geminitest.BatchPlan{Pending: 200 * time.Millisecond, Running: 300 * time.Millisecond})
	tasks := ids("nightly", 5)
	s.runBatched(t, tasks, 0, geminitest.TierBatch)
	jobs := s.batchJobs(t)
	for _, id := range tasks {
		got := s.get(t, id)
		in := jobsOf(jobs, id)
		if len(in) != 1 || in[0].GeminiState != gemini.BatchSucceeded {
			t.Errorf("%s ran in %d jobs, want one that succeeded", id, len(in))
			continue
		}
		if v := got.View(); v.Mode != task.ModeBatch || v.BatchJob != in[0].ID || got.Attempts != 0 || got.Delivery.State != task.DeliveryPending && got.Delivery.State != task.DeliveryDelivered {
			t.Errorf("%s: view mode %s batch_job %s, attempts %d, delivery %s", id, v.Mode, v.BatchJob, got.Attempts, got.Delivery.State)
		}
	}
}

// A settled job whose delete at Gemini fails is deleted by a later pass: until then Gemini holds
// every member's input and output, so the job stays open (deleting) rather than done with them
// left there.
func TestBatchJobDeleteFailedIsRetried(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	s.fake.FailBatchDeletesNext(http.StatusServiceUnavailable)
	s.runBatched(t, ids("erased", 3), 0, geminitest.TierBatch)
	jobs := s.batchJobs(t)
	l := s.fake.Ledger()
	for _, j := range jobs {
		for _, b := range l.BatchesNamed(j.ID) {
			if !b.Deleted {
				t.Errorf("batch job %s is done but Gemini still holds %s (%d requests)", j.ID, b.Name, b.Requests)
			}
		}
	}
}

// A job that fails or expires sends its tasks back, no attempt counted: the next job serves
// them, each billed once.
func TestBatchJobThatFailsOrExpiresGoesToTheNextJob(t *testing.T) {
	t.Parallel()
	for _, outcome := range []string{geminitest.BatchFailed, geminitest.BatchExpired} {
		t.Run(outcome, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, 0)
			s.fake.SetBatchPlan("m", geminitest.BatchPlan{Running: 200 * time.Millisecond})
			s.fake.FailBatchesNext("m", outcome)
			tasks := ids("back", 3)
			s.runBatched(t, tasks, 0, geminitest.TierBatch)
			jobs := s.batchJobs(t)
			if jobs[0].GeminiState == gemini.BatchSucceeded {
				t.Fatalf("the first job %s succeeded, want it %s", jobs[0].ID, outcome)
			}
			for _, m := range jobs[0].Members {
				in := jobsOf(jobs, m.TaskID)
				if len(in) != 2 || in[1].GeminiState != gemini.BatchSucceeded {
					t.Errorf("%s ran in %d jobs, want the lost one and a later one that succeeded", m.TaskID, len(in))
				}
			}
			for _, id := range tasks {
				if got := s.get(t, id); got.Attempts != 0 {
					t.Errorf("%s: %d attempts counted for a lost job", id, got.Attempts)
				}
			}
		})
	}
}

// One request failing inside a job sends that task back with an attempt counted; the others
// succeed from the first job.
func TestBatchRequestFailingInsideAJob(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	var once sync.Once
	s.fake.SetResponder(func(r geminitest.Request) geminitest.Reply {
		failed := false
		if strings.Contains(r.Prompt, "one-bad") {
			once.Do(func() { failed = true })
		}
		if failed {
			return geminitest.Reply{Code: http.StatusServiceUnavailable, Message: "The model is overloaded."}
		}
		return geminitest.DefaultReply(r)
	})
	tasks := []string{"one-good-1", "one-bad", "one-good-2"}
	s.runBatched(t, tasks, 0, geminitest.TierBatch)
	jobs := s.batchJobs(t)
	for _, id := range tasks {
		want := 1
		if id == "one-bad" {
			want = 2
		}
		if in := jobsOf(jobs, id); len(in) != want {
			t.Errorf("%s ran in %d jobs, want %d", id, len(in), want)
		}
	}
	if got := s.get(t, "one-bad"); got.Attempts != 1 {
		t.Errorf("the failed request's task has %d attempts, want 1", got.Attempts)
	}
}

// A task cancelled while its job runs stays cancelled: the job's answer records its cost and
// delivers nothing.
func TestBatchTaskCancelledMidJob(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	s.fake.SetBatchPlan("m", geminitest.BatchPlan{Running: 3 * time.Second})
	tasks := []string{"mid-kept", "mid-cancelled"}
	s.submitBatch(t, 0, tasks...)
	testenv.Start(t, run, s.batchEnv())
	waitFor(t, "the tasks in a job", 30*time.Second, func() bool { return s.get(t, "mid-cancelled").InBatchJob() })
	ctx := context.Background()
	if _, err := s.store.MutateTask(ctx, "mid-cancelled", func(t *protocol.Task, now time.Time) error {
		if !t.InBatchJob() {
			return fmt.Errorf("task is %s", t.State)
		}
		t.Finish(task.StateCancelled, now) // what POST /v1/tasks/{id}:cancel does
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.waitState(t, time.Minute, task.StateSucceeded, "mid-kept")
	waitFor(t, "the cancelled task's cost recorded", 30*time.Second, func() bool { return s.get(t, "mid-cancelled").CostUSD > 0 })
	got := s.get(t, "mid-cancelled")
	bills := s.fake.Ledger().BillsFor("mid-cancelled")
	if got.State != task.StateCancelled || got.HasOutput() || len(bills) != 1 || got.Usage != bills[0].Usage {
		t.Errorf("cancelled task: state %s output %v usage %+v; bills %+v: want cancelled, no output, the bill recorded", got.State, got.HasOutput(), got.Usage, bills)
	}
	if got.Delivery.EventType != task.EventCancelled {
		t.Errorf("delivery event %s, want only task.cancelled", got.Delivery.EventType)
	}
}

// A job still pending when its tasks must leave batching is cancelled; they run online before
// their run_before.
func TestBatchJobPastItsDeadlineGoesOnline(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	s.fake.SetBatchPlan("m", geminitest.BatchPlan{Pending: time.Hour})
	tasks := ids("late", 3)
	s.runBatched(t, tasks, 5*time.Second, geminitest.TierStandard, "GENBOX_BATCH_MARGIN", "3500ms")
	for _, j := range s.batchJobs(t) {
		if j.GeminiState != gemini.BatchCancelled {
			t.Errorf("batch job %s ended %s, want cancelled at its deadline", j.ID, j.GeminiState)
		}
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The batcher killed at each step of a job's life: after a restart every task succeeds, each
// batch was created at Gemini once, and each request billed once.
func TestBatchCrashMatrix(t *testing.T) {
	t.Parallel()
	crashBinary(t)
	for _, point := range crashpoint.BatchPoints {
		t.Run(string(point), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, 0)
			s.fake.SetBatchPlan("m", geminitest.BatchPlan{Pending: 300 * time.Millisecond, Running: 300 * time.Millisecond})
			tasks := ids(string(point), 4)
			s.submitBatch(t, 0, tasks...)
			crashed := spawn(t, s.batchEnv("GENBOX_CRASHPOINT", string(point), "GENBOX_INSTANCE_ID", "crashing"))
			crashed.waitKilled(t, crashRecovery)
			spawn(t, s.batchEnv("GENBOX_INSTANCE_ID", "fresh"))
			s.waitState(t, crashRecovery, task.StateSucceeded, tasks...)
			s.checkBilledOnce(t, geminitest.TierBatch, tasks...)
			for _, id := range tasks {
				if in := jobsOf(s.batchJobs(t), id); len(in) != 1 {
					t.Errorf("%s ran in %d jobs, want one", id, len(in))
				}
			}
		})
	}
}

// A pass that settles a large job outlasts the leadership lease; the batcher renews it during
// the pass, so it never loses its model to a lapse (which would hold a job it was creating for
// the reconcile grace, a minute by default). One instance: the lease's epoch never moves.
func TestBatchLeaderKeepsItsLeaseThroughALongPass(t *testing.T) {
	t.Parallel()
	s := newStack(t, 0)
	tasks := ids("long", 300)
	s.submitBatch(t, 0, tasks...)
	testenv.Start(t, run, s.batchEnv("GENBOX_BATCH_LEADER_TTL", "3s"))
	s.waitState(t, 2*time.Minute, task.StateSucceeded, tasks...)
	snap, err := s.store.FS.Collection(store.LeadersCollection).Doc("batcher-m").Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if epoch, _ := snap.DataAt("epoch"); epoch != int64(1) {
		t.Errorf("the batcher's leadership epoch is %v after one instance's run, want 1: it lapsed and was taken again", epoch)
	}
}
