package rerun_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/devstack"
	"github.com/genbox-dev/genbox/internal/emulator"
	"github.com/genbox-dev/genbox/internal/rerun"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/client"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestMain(m *testing.M) { os.Exit(emulator.RunTests(m)) }

// bundle is a dev stack whose tenant's limits the test chose, and its client.
type bundle struct {
	stack  *devstack.Stack
	client *client.Client
	limits store.Limits
}

// setup starts a dev stack (the fake Gemini answering after latency) with the dev tenant's
// limits set to limits, its submission rate lifted so hundreds of tasks go in at once.
func setup(t *testing.T, limits store.Limits, latency time.Duration, extra ...string) *bundle {
	t.Helper()
	s := devstack.StartTestWith(t, func(cfg *devstack.Config) {
		cfg.Fake = append(cfg.Fake, geminitest.WithLatency("", geminitest.Fixed(latency)))
	}, extra...)
	limits.SubmitRate, limits.SubmitBurst = 10000, 10000
	if _, err := s.Store.SetTenantLimits(t.Context(), devstack.DevTenant, limits); err != nil {
		t.Fatal(err)
	}
	return &bundle{stack: s, client: client.New(s.Info.Publisher, s.Info.APIKey), limits: limits}
}

// marker is the text that tells task i of label apart in the prompts the fake received.
func marker(label string, i int) string { return fmt.Sprintf("<<%s-%d>>", label, i) }

// submit submits n summarize tasks labelled batch=label and waits until all have succeeded.
func (b *bundle) submit(t *testing.T, ctx context.Context, label string, n int) []string {
	t.Helper()
	var ids []string
	for start := 0; start < n; start += task.MaxBatch {
		var reqs []task.Request
		for i := start; i < min(n, start+task.MaxBatch); i++ {
			reqs = append(reqs, task.Request{Family: "summarize", Input: "re-run me " + marker(label, i), Labels: map[string]string{"batch": label}})
		}
		res, err := b.client.SubmitBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Results {
			if r.Status != 202 {
				t.Fatalf("submit: %+v", r)
			}
			ids = append(ids, r.TaskID)
		}
	}
	b.waitTasks(t, ctx, ids, func(tk *protocol.Task) bool { return tk.State == task.StateSucceeded })
	return ids
}

// waitTasks waits until every task of ids satisfies done.
func (b *bundle) waitTasks(t *testing.T, ctx context.Context, ids []string, done func(*protocol.Task) bool) []*protocol.Task {
	t.Helper()
	for {
		var out []*protocol.Task
		for _, id := range ids {
			tk, err := b.stack.Store.GetTask(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if !done(tk) {
				break
			}
			out = append(out, tk)
		}
		if len(out) == len(ids) {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d tasks done before the deadline", len(out), len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRerun waits until the re-run has completed and returns it as the API shows it.
func (b *bundle) waitRerun(t *testing.T, ctx context.Context, id string) *task.Rerun {
	t.Helper()
	for {
		v, err := b.client.GetRerun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if v.State == task.RerunCompleted {
			return v
		}
		if ctx.Err() != nil {
			t.Fatalf("the re-run did not complete: %+v", v.Progress)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// billed prices the fake's bills at the stack's price table (the built-in one).
func billed(bills []geminitest.Bill) float64 {
	p := gemini.DefaultPricing()
	var usd float64
	for _, b := range bills {
		usd += p.Price(b.Request.Model).Bill(b.Usage, gemini.Tier(b.Tier))
	}
	return usd
}

// checkReplayedOnce checks that each task ran exactly one new replay, for re-run rerunID, under
// the current prompt version, its first outcome kept in previous[].
func checkReplayedOnce(t *testing.T, tasks []*protocol.Task, rerunID string) {
	t.Helper()
	for _, tk := range tasks {
		if tk.Replay != 1 || len(tk.Previous) != 1 || tk.Rerun != rerunID || tk.State != task.StateSucceeded ||
			tk.Previous[0].State != task.StateSucceeded || tk.Previous[0].Output == "" {
			t.Fatalf("task %s: replay %d, previous %+v, rerun %q, state %s; want one new replay of re-run %s, the first kept",
				tk.ID, tk.Replay, tk.Previous, tk.Rerun, tk.State, rerunID)
		}
	}
}

func TestDryRunEstimatesWhatTheRunBills(t *testing.T) {
	t.Parallel()
	b := setup(t, store.Limits{Concurrency: 10}, 0, "GENBOX_RERUN_INTERVAL", "100ms")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ids := b.submit(t, ctx, "est", 60)
	b.submit(t, ctx, "other", 5) // not matched

	filter := task.RerunFilter{Family: "summarize", Labels: map[string]string{"batch": "est"}, State: task.StateSucceeded}
	dry, err := b.client.Rerun(ctx, task.RerunRequest{Filter: filter, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Count != len(ids) || dry.RerunID != "" || dry.EstimatedCostUSD <= 0 {
		t.Fatalf("dry run: %+v, want a count of %d, an estimate and no re-run", dry, len(ids))
	}
	before := b.stack.Fake.Ledger()
	rr, err := b.client.Rerun(ctx, task.RerunRequest{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.client.Rerun(ctx, task.RerunRequest{Filter: filter, RerunID: rr.RerunID})
	if err != nil || again.RerunID != rr.RerunID {
		t.Fatalf("the same rerun_id again: %+v %v, want re-run %s", again, err, rr.RerunID)
	}
	done := b.waitRerun(t, ctx, rr.RerunID)
	want := task.RerunProgress{Matched: len(ids), Started: len(ids), Done: len(ids)}
	if *done.Progress != want || done.Count != len(ids) {
		t.Fatalf("progress %+v count %d, want %+v", *done.Progress, done.Count, want)
	}
	after := b.stack.Fake.Ledger()
	bill := billed(after.Bills[len(before.Bills):])
	off := math.Abs(dry.EstimatedCostUSD-bill) / bill
	t.Logf("estimate $%.8f, billed $%.8f on the fake for %d calls: off by %.2f%%", dry.EstimatedCostUSD, bill,
		after.Total.Calls-before.Total.Calls, 100*off)
	if off > 0.10 {
		t.Fatalf("estimate $%.8f is %.1f%% off the $%.8f billed, want within 10%%", dry.EstimatedCostUSD, 100*off, bill)
	}
	tasks := b.waitTasks(t, ctx, ids, func(*protocol.Task) bool { return true })
	checkReplayedOnce(t, tasks, rerun.DocID(devstack.DevTenant, rr.RerunID))
}

// crashingCatalog renders as the registry does, and from the threshold-th render on cancels
// the pacer's context at the first render that is not the first of its page: that task's start
// fails and the page is abandoned with the tasks before it started, none nudged, and the cursor
// before them all — a pacer killed mid-page.
type crashingCatalog struct {
	rerun.Catalog
	store     *store.Store
	rerunID   string
	threshold int
	kill      context.CancelFunc

	mu      sync.Mutex
	renders int
	killed  bool
}

func (c *crashingCatalog) Render(family, variant, input string, cfg *task.GenConfig) (*prompts.Rendered, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renders++
	if !c.killed && c.renders >= c.threshold {
		// Every rendered task is matched, and counted when its page commits: what the store
		// does not count yet was rendered in this page.
		if r, err := c.store.GetRerun(context.Background(), c.rerunID); err == nil && c.renders-r.Progress.Matched >= 2 {
			c.killed = true
			c.kill()
		}
	}
	return c.Catalog.Render(family, variant, input, cfg)
}

// peakCalls is the most model calls of replay in flight at once among tasks, from their
// attempt logs.
func peakCalls(tasks []*protocol.Task, replay int) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, tk := range tasks {
		for _, a := range tk.AttemptLog {
			if a.Replay == replay {
				edges = append(edges, edge{a.At, 1}, edge{a.At.Add(time.Duration(a.Latency) * time.Millisecond), -1})
			}
		}
	}
	slices.SortFunc(edges, func(x, y edge) int {
		if c := x.at.Compare(y.at); c != 0 {
			return c
		}
		return x.delta - y.delta // an end before a start at the same instant
	})
	peak, n := 0, 0
	for _, e := range edges {
		n += e.delta
		peak = max(peak, n)
	}
	return peak
}

func TestRerunOf500ResumesAfterACrashAndRunsEachTaskOnce(t *testing.T) {
	t.Parallel()
	const n, capacity, budget = 500, 8, 5.0
	// The stack's own pacer waits an hour before its first pass: this test runs the pacers.
	b := setup(t, store.Limits{Concurrency: capacity, DailyBudgetUSD: budget}, 20*time.Millisecond, "GENBOX_RERUN_INTERVAL", "1h")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	ids := b.submit(t, ctx, "bulk", n)

	filter := task.RerunFilter{Labels: map[string]string{"batch": "bulk"}}
	dry, err := b.client.Rerun(ctx, task.RerunRequest{Filter: filter, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	rr, err := b.client.Rerun(ctx, task.RerunRequest{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	docID := rerun.DocID(devstack.DevTenant, rr.RerunID)
	before := b.stack.Fake.Ledger()

	reg, err := prompts.Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg := rerun.Config{Interval: 50 * time.Millisecond, Page: 50, Window: 50, LeaseTTL: time.Second, Hold: 2 * time.Second}
	log := slog.New(slog.DiscardHandler)
	limits := tenantLimits{b.limits}

	pub := bus.NewPublisher(testenv.PubSub(t, b.stack.Info.Project))
	crashCtx, kill := context.WithCancel(ctx)
	cat := &crashingCatalog{Catalog: reg, store: b.stack.Store, rerunID: docID, threshold: n / 2, kill: kill}
	first := rerun.NewPacer(b.stack.Store, pub, cat, limits, cfg, "pacer-1", log)
	stopped := make(chan struct{})
	go func() { defer close(stopped); first.Run(crashCtx) }()
	<-stopped
	mid, err := b.stack.Store.GetRerun(ctx, docID)
	if err != nil {
		t.Fatal(err)
	}
	started := 0
	for _, id := range ids {
		if tk, err := b.stack.Store.GetTask(ctx, id); err == nil && tk.Rerun == docID {
			started++
		}
	}
	t.Logf("pacer killed: cursor committed past %d tasks, %d tasks started, lease held by %q", mid.Progress.Matched, started, mid.Lease.Owner)
	if started <= mid.Progress.Started || mid.Lease.Owner != "pacer-1" {
		t.Fatalf("the crash left %d started and %d committed, lease %+v: want a page started but not committed, the lease left held",
			started, mid.Progress.Started, mid.Lease)
	}

	resumed, stop := context.WithCancel(ctx)
	defer stop()
	second := rerun.NewPacer(b.stack.Store, pub, reg, limits, cfg, "pacer-2", log)
	go second.Run(resumed)
	done := b.waitRerun(t, ctx, rr.RerunID)
	stop()

	want := task.RerunProgress{Matched: n, Started: n, Done: n}
	if *done.Progress != want {
		t.Fatalf("progress %+v, want %+v", *done.Progress, want)
	}
	tasks := b.waitTasks(t, ctx, ids, func(*protocol.Task) bool { return true })
	checkReplayedOnce(t, tasks, docID)
	after := b.stack.Fake.Ledger()
	calls := after.Total.Calls - before.Total.Calls
	for i := range n {
		if got := len(after.BillsFor(marker("bulk", i))); got != 2 {
			t.Fatalf("task %d was billed %d times, want 2 (its first run and one re-run)", i, got)
		}
	}
	if calls != n {
		t.Fatalf("the re-run made %d model calls, want %d: one per task", calls, n)
	}
	peak := peakCalls(tasks, 1)
	var spent float64
	for _, tk := range tasks {
		spent += tk.CostUSD + tk.Previous[0].CostUSD
	}
	bill := billed(after.Bills[len(before.Bills):])
	t.Logf("%d tasks re-run once each: %d model calls, peak %d in flight (cap %d), estimate $%.6f, billed $%.6f, tenant's spend today $%.6f (budget $%.2f)",
		n, calls, peak, capacity, dry.EstimatedCostUSD, bill, spent, budget)
	if peak > capacity {
		t.Fatalf("%d model calls of the re-run in flight at once, over the tenant's cap of %d", peak, capacity)
	}
	if spent > budget {
		t.Fatalf("the tenant spent $%.6f, over its budget of $%.2f", spent, budget)
	}
}

// tenantLimits answers the limits the test set (worker.TenantCache reads them from the store).
type tenantLimits struct{ l store.Limits }

func (t tenantLimits) Limits(context.Context, string) (store.Limits, error) { return t.l, nil }

// A re-run of a tenant whose daily budget is spent calls no model: its first window of tasks
// waits on the budget and the pacer starts no more; once the budget is raised it runs to the
// end, each task once.
func TestRerunWaitsOnTheTenantsBudget(t *testing.T) {
	t.Parallel()
	const n, capacity = 40, 4
	b := setup(t, store.Limits{Concurrency: capacity, DailyBudgetUSD: 10}, 0,
		"GENBOX_RERUN_INTERVAL", "100ms", "GENBOX_BUDGET_RETRY", "300ms", "GENBOX_TENANT_REFRESH", "200ms")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ids := b.submit(t, ctx, "budget", n)
	var spent float64
	for _, tk := range b.waitTasks(t, ctx, ids, func(*protocol.Task) bool { return true }) {
		spent += tk.CostUSD
	}
	// The budget is what the tenant has spent today: no call's worst case fits.
	limits := b.limits
	limits.DailyBudgetUSD = spent
	if _, err := b.stack.Store.SetTenantLimits(ctx, devstack.DevTenant, limits); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // past the worker's tenant refresh
	before := b.stack.Fake.Ledger()
	rr, err := b.client.Rerun(ctx, task.RerunRequest{Filter: task.RerunFilter{Labels: map[string]string{"batch": "budget"}}})
	if err != nil {
		t.Fatal(err)
	}
	docID := rerun.DocID(devstack.DevTenant, rr.RerunID)
	var waiting int
	for waiting < capacity {
		waiting = 0
		for _, id := range ids {
			if tk, err := b.stack.Store.GetTask(ctx, id); err == nil && tk.Rerun == docID && tk.State == task.StateWaiting {
				waiting++
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of the re-run's tasks wait on the budget, want %d", waiting, capacity)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // ten pacer passes
	held, err := b.stack.Store.GetRerun(ctx, docID)
	if err != nil {
		t.Fatal(err)
	}
	calls := b.stack.Fake.Ledger().Total.Calls - before.Total.Calls
	t.Logf("budget $%.6f spent: %d tasks waiting, %d started, %d model calls", spent, waiting, held.Progress.Started, calls)
	if held.Progress.Started != capacity || calls != 0 {
		t.Fatalf("over budget: %d started, %d model calls; want the window of %d started and no call", held.Progress.Started, calls, capacity)
	}

	limits.DailyBudgetUSD = 10
	if _, err := b.stack.Store.SetTenantLimits(ctx, devstack.DevTenant, limits); err != nil {
		t.Fatal(err)
	}
	done := b.waitRerun(t, ctx, rr.RerunID)
	if want := (task.RerunProgress{Matched: n, Started: n, Done: n}); *done.Progress != want {
		t.Fatalf("progress %+v, want %+v", *done.Progress, want)
	}
	if calls := b.stack.Fake.Ledger().Total.Calls - before.Total.Calls; calls != n {
		t.Fatalf("%d model calls, want %d", calls, n)
	}
	checkReplayedOnce(t, b.waitTasks(t, ctx, ids, func(*protocol.Task) bool { return true }), docID)
}
