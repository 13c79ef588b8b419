package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// modelPolicy is the service's policy over the bundle: tenant limits from the store and
// budget re-checks.
func (b *bundle) modelPolicy(budget quota.BudgetPolicy) ModelPolicy {
	return ModelPolicy{
		Estimator: b.gen, Tenants: NewTenantCache(b.store, time.Minute),
		Budgets:      quota.NewBudgets(b.store, time.Now, time.Minute),
		BudgetPolicy: budget, BudgetRetry: time.Hour,
	}
}

// policyHandler is a handler over the embedded prompt families with the model policy mp.
func (b *bundle) policyHandler(t *testing.T, pol Policy, mp ModelPolicy) *Handler {
	t.Helper()
	reg, err := prompts.Default()
	if err != nil {
		t.Fatal(err)
	}
	return b.handler(pol, reg, WithModelPolicy(mp))
}

func (b *bundle) tenant(t testing.TB, id string, l store.Limits) {
	t.Helper()
	b.store.Secrets = testenv.Secrets()
	if _, err := b.store.CreateTenant(context.Background(), id, l, "whsec"); err != nil {
		t.Fatal(err)
	}
}

// payload decodes the webhook event frozen on the task's delivery.
func payload(t *testing.T, d *protocol.Task) task.Event {
	t.Helper()
	var ev task.Event
	if err := json.Unmarshal([]byte(d.Delivery.Payload), &ev); err != nil {
		t.Fatalf("payload of %s: %v", d.ID, err)
	}
	return ev
}

// The same request twice with cache: true makes one model call; another temperature, another
// tenant, no cache, or a Regenerate each make their own. A hit costs the task nothing.
func TestCacheOneCallPerIdenticalRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	h := b.policyHandler(t, policy("w1"), b.modelPolicy(quota.BudgetWait))
	same := func(d *protocol.Task) { d.Input, d.Cache = "The quarterly report says revenue rose.", true }
	tests := []struct {
		id       string
		doc      func(*protocol.Task)
		newCalls int
		hit      bool
	}{
		{"first", same, 1, false},
		{"again", same, 0, true},
		{"warmer", func(d *protocol.Task) { same(d); d.GenConfig = &task.GenConfig{Temperature: ptr(0.9)} }, 1, false},
		{"warmer-again", func(d *protocol.Task) { same(d); d.GenConfig = &task.GenConfig{Temperature: ptr(0.9)} }, 0, true},
		{"other-tenant", func(d *protocol.Task) { same(d); d.Tenant = "tenant-b" }, 1, false},
		{"uncached", func(d *protocol.Task) { same(d); d.Cache = false }, 1, false},
		{"regenerated", func(d *protocol.Task) { same(d); d.BypassCache, d.Replay = true, 1 }, 1, false},
	}
	var firstOutput string
	for _, tc := range tests {
		before := b.srv.Ledger().Total.Calls
		b.task(t, tc.id, tc.doc)
		h.Handle(context.Background(), msg(tc.id))
		got := b.get(t, tc.id)
		if calls := b.srv.Ledger().Total.Calls - before; calls != tc.newCalls {
			t.Errorf("%s: %d model calls, want %d", tc.id, calls, tc.newCalls)
		}
		if got.State != task.StateSucceeded || got.CacheHit != tc.hit {
			t.Errorf("%s: state %s cache_hit %v, want succeeded, %v", tc.id, got.State, got.CacheHit, tc.hit)
		}
		if tc.id == "first" {
			firstOutput = got.Output
		}
		if tc.hit {
			if got.Usage != (task.Usage{}) || got.CostUSD != 0 || got.ModelCalls != 0 || got.Model == "" {
				t.Errorf("%s: a hit shows usage %+v cost %v calls %d model %q; want nothing spent", tc.id, got.Usage, got.CostUSD, got.ModelCalls, got.Model)
			}
			if ev := payload(t, got); !ev.Data.CacheHit {
				t.Errorf("%s: webhook payload without cache_hit", tc.id)
			}
		}
		if tc.id == "again" && got.Output != firstOutput {
			t.Errorf("again: output %q, want the first's %q", got.Output, firstOutput)
		}
	}
	if n := b.count(t, h, obs.MetricCacheHits); n != 2 {
		t.Errorf("%d cache hits, want 2", n)
	}
}

// A task whose tenant's budget is spent, whose max_cost_usd is below the estimate or whose
// run_before has passed follows its policy without any model call.
func TestNoCallBeyondBudgetOrDeadline(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": "m=1000/1000"}) // a call costs about $1
	ctx := context.Background()
	b.tenant(t, "poor", store.Limits{DailyBudgetUSD: 5})
	if err := b.store.AddSpend(ctx, quota.SpendFlush{Tenant: "poor", Day: quota.Day(time.Now()), Origin: "earlier", Seq: 1, USD: 4.5}); err != nil {
		t.Fatal(err)
	}
	wait := b.policyHandler(t, policy("w1"), b.modelPolicy(quota.BudgetWait))
	fail := b.policyHandler(t, policy("w2"), b.modelPolicy(quota.BudgetFail))
	now := time.Now()
	tests := []struct {
		id    string
		h     *Handler
		doc   func(*protocol.Task)
		state task.State
		kind  task.ErrorKind
	}{
		{"budget-wait", wait, func(d *protocol.Task) { d.Tenant = "poor" }, task.StateWaiting, task.KindBudget},
		{"budget-fail", fail, func(d *protocol.Task) { d.Tenant = "poor" }, task.StateFailed, task.KindBudget},
		{"max-cost", wait, func(d *protocol.Task) { d.MaxCostUSD = ptr(0.01) }, task.StateFailed, task.KindBudget},
		{"run-before", wait, func(d *protocol.Task) { d.RunBefore = ptr(now.Add(-time.Second)) }, task.StateFailed, task.KindExpired},
	}
	for _, tc := range tests {
		b.task(t, tc.id, tc.doc)
		tc.h.Handle(ctx, msg(tc.id))
		got := b.get(t, tc.id)
		if got.State != tc.state || got.Error == nil || got.Error.Kind != tc.kind {
			t.Errorf("%s: state %s error %+v, want %s with kind %s", tc.id, got.State, got.Error, tc.state, tc.kind)
		}
		if got.Lease.Owner != "" || got.Attempts != 0 || got.ModelCalls != 0 {
			t.Errorf("%s: lease %+v attempts %d calls %d, want released, nothing counted", tc.id, got.Lease, got.Attempts, got.ModelCalls)
		}
		if tc.state == task.StateWaiting && (got.NotBefore == nil || !got.NotBefore.After(now) || got.NotBefore.After(quota.ResetAt(now))) {
			t.Errorf("%s: not_before %v, want after now and no later than the budget day's reset %v", tc.id, got.NotBefore, quota.ResetAt(now))
		}
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 0 {
		t.Errorf("%d model calls, want none", calls)
	}
	// A tenant with room is charged what it spends, so the same tenant then runs out: a call
	// reserves its attempt budget (2 calls of $1.08), and $2.2 has room for one such reservation,
	// not for what the first spent ($0.09) and another.
	b.tenant(t, "rich", store.Limits{DailyBudgetUSD: 2.2})
	b.task(t, "rich-1", func(d *protocol.Task) { d.Tenant = "rich" })
	b.task(t, "rich-2", func(d *protocol.Task) { d.Tenant = "rich" })
	wait.Handle(ctx, msg("rich-1"))
	wait.Handle(ctx, msg("rich-2"))
	if s1, s2 := b.get(t, "rich-1").State, b.get(t, "rich-2").State; s1 != task.StateSucceeded || s2 != task.StateWaiting {
		t.Errorf("rich: %s, %s; want the first to run and the second to wait for the budget", s1, s2)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 1 {
		t.Errorf("%d model calls, want 1", calls)
	}
}

// During a full outage a stale family answers with the tenant's last good output for the subject,
// flagged stale in the task and its webhook; another tenant or subject has none and is parked.
func TestStaleAnswerWhenEveryModelIsDown(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{
		"GENBOX_BREAKER_FAILURES": "1", "GENBOX_BREAKER_COOLDOWN": "1h", "GENBOX_MAX_ATTEMPTS": "1",
	})
	b.srv.SetResponder(bulletList)
	h := b.policyHandler(t, policy("w1"), b.modelPolicy(quota.BudgetWait))
	ctx := context.Background()
	digest := func(tenant, subject string) func(*protocol.Task) {
		return func(d *protocol.Task) { d.Tenant, d.Variant, d.SubjectKey = tenant, "digest", subject }
	}
	b.task(t, "fresh", digest("tenant-a", "site-1"))
	h.Handle(ctx, msg("fresh"))
	fresh := b.get(t, "fresh")
	if fresh.State != task.StateSucceeded || fresh.Stale {
		t.Fatalf("fresh: state %s stale %v", fresh.State, fresh.Stale)
	}

	b.srv.Outage("", time.Hour)
	b.task(t, "trip", func(d *protocol.Task) {}) // its failed call opens the only breaker
	h.Handle(ctx, msg("trip"))
	if b.gen.Available(nil) {
		t.Fatal("the breaker did not open")
	}
	if got := b.get(t, "trip"); got.State != task.StateWaiting || got.Attempts != 0 {
		t.Errorf("trip: state %s attempts %d; the call that opened the last breaker parks, no attempt counted", got.State, got.Attempts)
	}
	calls := b.srv.Ledger().Total.Calls

	tests := []struct {
		id    string
		doc   func(*protocol.Task)
		state task.State
	}{
		{"stale", digest("tenant-a", "site-1"), task.StateSucceeded},
		{"other-tenant", digest("tenant-b", "site-1"), task.StateWaiting},
		{"other-subject", digest("tenant-a", "site-2"), task.StateWaiting},
		{"park-family", func(d *protocol.Task) { d.SubjectKey = "site-1" }, task.StateWaiting},
	}
	for _, tc := range tests {
		b.task(t, tc.id, tc.doc)
		h.Handle(ctx, msg(tc.id))
		got := b.get(t, tc.id)
		if got.State != tc.state {
			t.Errorf("%s: state %s, want %s", tc.id, got.State, tc.state)
			continue
		}
		if tc.state != task.StateSucceeded {
			continue
		}
		ev := payload(t, got)
		if !got.Stale || !ev.Data.Stale || got.Output != fresh.Output || got.CacheHit || got.CostUSD != 0 {
			t.Errorf("%s: stale %v (webhook %v) output %q cache_hit %v cost %v; want fresh's output %q flagged stale, nothing spent",
				tc.id, got.Stale, ev.Data.Stale, got.Output, got.CacheHit, got.CostUSD, fresh.Output)
		}
	}
	if n := b.srv.Ledger().Total.Calls - calls; n != 0 {
		t.Errorf("%d model calls with every breaker open, want none", n)
	}
}

// A fallback model's answer is recorded as degraded on the task and in its webhook, and never
// cached: the same request again calls the model.
func TestDegradedRecordedNeverCached(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_MAX_ATTEMPTS": "3"}) // two on the primary, one left for the fallback
	b.srv.Outage("primary", time.Hour)
	r := fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Prompt: input, Models: []string{"primary", "fallback"}, CacheAllowed: true, Version: "v1"}, nil
	}}
	h := New(b.store, b.gen, r, b.pub, b.log, policy("w1"), WithModelPolicy(b.modelPolicy(quota.BudgetWait)))
	ctx := context.Background()
	for _, id := range []string{"one", "two"} {
		b.task(t, id, func(d *protocol.Task) { d.Input, d.Cache = "the same text", true })
		h.Handle(ctx, msg(id))
		got := b.get(t, id)
		if got.State != task.StateSucceeded {
			t.Fatalf("%s: state %s error %+v", id, got.State, got.Error)
		}
		if !got.Degraded || got.Model != "fallback" || got.CacheHit || !payload(t, got).Data.Degraded {
			t.Errorf("%s: state %s degraded %v (webhook %v) model %q cache_hit %v; want the fallback's degraded answer, not from the cache",
				id, got.State, got.Degraded, payload(t, got).Data.Degraded, got.Model, got.CacheHit)
		}
	}
	if n := b.srv.Ledger().Model("fallback").Generations; n != 2 {
		t.Errorf("fallback generated %d times, want 2: a degraded output is never cached", n)
	}
}

// What an instance spent reaches the tenant's counters at shutdown, between two periodic flushes.
func TestFlushSpendAtShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	budgets := quota.NewBudgets(b.store, time.Now, time.Minute)
	hold, err := budgets.Reserve(context.Background(), "tenant-a", 0, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	hold.Settle(0.25)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); FlushSpend(ctx, b.log, budgets, time.Hour) }()
	cancel()
	<-done
	spent, _, err := b.store.Spent(context.Background(), "tenant-a", quota.Day(time.Now()), "")
	if err != nil || spent != 0.25 {
		t.Errorf("spent %v (%v), want 0.25 flushed at shutdown", spent, err)
	}
}

// A call reserves against its tenant's budget what it may spend with all its attempts (answered
// and in-doubt calls alike), not one call's estimate: a budget with room for one call but not
// for the attempt budget holds the task back without a call.
func TestBudgetReservesTheAttemptBudget(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": "m=1000/1000"}) // a call may cost about $1.08; 2 attempts
	ctx := context.Background()
	b.tenant(t, "tight", store.Limits{DailyBudgetUSD: 1.5})
	h := b.policyHandler(t, policy("w1"), b.modelPolicy(quota.BudgetWait))
	b.task(t, "tight-1", func(d *protocol.Task) { d.Tenant = "tight" })
	h.Handle(ctx, msg("tight-1"))
	got := b.get(t, "tight-1")
	if got.State != task.StateWaiting || got.Error == nil || got.Error.Kind != task.KindBudget {
		t.Errorf("state %s error %+v, want waiting on the budget", got.State, got.Error)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 0 {
		t.Errorf("%d model calls, want none: $1.5 cannot cover two attempts of $1.08", calls)
	}
}

// A DELETE that lands after the output's commit and before its cache entry and last good
// output are written leaves neither behind: the worker's write sees the erase and writes
// nothing, so no later cache hit or stale answer serves the erased output.
func TestEraseBetweenCommitAndRemember(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.srv.SetResponder(bulletList)
	h := b.policyHandler(t, policy("w1"), b.modelPolicy(quota.BudgetWait))
	ctx := context.Background()
	var committed *protocol.Task
	h.beforeRemember = func(tk *protocol.Task) { // what DELETE /v1/tasks/{id} does, in the window
		committed = tk
		if _, err := b.store.MutateTask(ctx, tk.ID, func(d *protocol.Task, now time.Time) error { d.Erase(now); return nil }); err != nil {
			t.Error(err)
		}
		if err := b.store.EraseOutputs(ctx, tk.ID, tk.Fingerprint); err != nil {
			t.Error(err)
		}
	}
	b.task(t, "erased", func(d *protocol.Task) { d.Variant, d.SubjectKey, d.Cache = "digest", "site-1", true })
	h.Handle(ctx, msg("erased"))
	if committed == nil || committed.Fingerprint == "" || committed.Output == "" {
		t.Fatalf("the output was not committed with a fingerprint before the window: %+v", committed)
	}
	if got := b.get(t, "erased"); got.ErasedAt == nil || got.Output != "" {
		t.Fatalf("task not erased: %+v", got)
	}
	if o, err := b.store.GetOutput(ctx, "tenant-a", committed.Fingerprint); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cache entry written after the erase: %+v %v", o, err)
	}
	if o, err := b.store.GetLastGood(ctx, "tenant-a", "summarize", "digest", "site-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("last good output written after the erase: %+v %v", o, err)
	}
}

// A tenant whose limits set no daily budget is held to the deployment's default: created without
// one and with $4.5 spent of a $5 default, its task waits without a call, while a tenant with a
// budget of its own runs.
func TestDefaultBudgetStopsATenantWithoutOne(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": "m=1000/1000"}) // a call may cost about $1.08
	ctx := context.Background()
	b.tenant(t, "newcomer", store.DefaultLimits())
	b.tenant(t, "funded", store.Limits{DailyBudgetUSD: 50})
	for _, tenant := range []string{"newcomer", "funded"} {
		if err := b.store.AddSpend(ctx, quota.SpendFlush{Tenant: tenant, Day: quota.Day(time.Now()), Origin: "earlier", Seq: 1, USD: 4.5}); err != nil {
			t.Fatal(err)
		}
	}
	mp := b.modelPolicy(quota.BudgetWait)
	mp.DefaultDailyBudgetUSD = 5
	h := b.policyHandler(t, policy("w1"), mp)
	b.task(t, "new-1", func(d *protocol.Task) { d.Tenant = "newcomer" })
	b.task(t, "funded-1", func(d *protocol.Task) { d.Tenant = "funded" })
	h.Handle(ctx, msg("new-1"))
	if got := b.get(t, "new-1"); got.State != task.StateWaiting || got.Error == nil || got.Error.Kind != task.KindBudget || got.ModelCalls != 0 {
		t.Errorf("tenant without a budget, $4.5 spent of the $5 default: state %s error %+v calls %d; want waiting on its budget, no call",
			got.State, got.Error, got.ModelCalls)
	}
	h.Handle(ctx, msg("funded-1"))
	if got := b.get(t, "funded-1"); got.State != task.StateSucceeded {
		t.Errorf("tenant with its own $50 budget: state %s error %+v; want succeeded (its budget, not the default)", got.State, got.Error)
	}
}

// The project's budget stops every tenant together, each well within its own: tasks of two
// tenants run in turn until the project's budget has no room for the next, which then waits
// (whatever the tenant budget policy) without a call and without an attempt counted.
func TestProjectBudgetStopsTenantsTogether(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": "m=1000/1000"}) // reserves about $2.16 a call
	ctx := context.Background()
	b.tenant(t, "acme", store.Limits{DailyBudgetUSD: 100})
	b.tenant(t, "globex", store.Limits{DailyBudgetUSD: 100})
	mp := b.modelPolicy(quota.BudgetFail)
	mp.Budgets = quota.NewBudgets(b.store, time.Now, time.Minute, quota.WithProjectLimit(2.5))
	h := b.policyHandler(t, policy("w1"), mp)
	ran := map[string]int{}
	var stopped *protocol.Task
	for i := range 20 {
		tenant := []string{"acme", "globex"}[i%2]
		id := fmt.Sprintf("%s-%d", tenant, i)
		b.task(t, id, func(d *protocol.Task) { d.Tenant = tenant })
		h.Handle(ctx, msg(id))
		got := b.get(t, id)
		if got.State != task.StateSucceeded {
			stopped = got
			break
		}
		ran[tenant]++
	}
	if ran["acme"] == 0 || ran["globex"] == 0 || stopped == nil {
		t.Fatalf("ran %v, stopped %v; want both tenants to run, then a task stopped by the project's $2.5", ran, stopped)
	}
	if stopped.State != task.StateWaiting || stopped.Error == nil || !strings.Contains(stopped.Error.Message, "project") ||
		stopped.ModelCalls != 0 || stopped.Attempts != 0 || stopped.NotBefore == nil {
		t.Errorf("stopped task: state %s error %+v calls %d attempts %d not_before %v; want waiting on the project's budget, nothing spent",
			stopped.State, stopped.Error, stopped.ModelCalls, stopped.Attempts, stopped.NotBefore)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != ran["acme"]+ran["globex"] {
		t.Errorf("%d model calls for %v tasks run", calls, ran)
	}
}

// unreadableProject is the store with the project's spend counter unreadable.
type unreadableProject struct{ *store.Store }

func (u unreadableProject) Spent(ctx context.Context, tenant, day, origin string) (float64, int64, error) {
	if tenant == quota.ProjectCounter {
		return 0, 0, errors.New("rpc error: code = Unavailable desc = injected")
	}
	return u.Store.Spent(ctx, tenant, day, origin)
}

// While the project's spend counter cannot be read, no paid call starts: the task is handed
// back, queued for later, with no attempt counted.
func TestUnreadableProjectBudgetStartsNoCall(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()
	b.tenant(t, "acme", store.Limits{DailyBudgetUSD: 100})
	mp := b.modelPolicy(quota.BudgetWait)
	mp.Budgets = quota.NewBudgets(unreadableProject{b.store}, time.Now, time.Minute, quota.WithProjectLimit(100))
	h := b.policyHandler(t, policy("w1"), mp)
	b.task(t, "blind", func(d *protocol.Task) { d.Tenant = "acme" })
	start := time.Now()
	h.Handle(ctx, msg("blind"))
	got := b.get(t, "blind")
	if got.State != task.StateQueued || got.Attempts != 0 || got.ModelCalls != 0 || got.Lease.Owner != "" || got.NotBefore == nil || !got.NotBefore.After(start) {
		t.Errorf("state %s attempts %d calls %d lease %+v not_before %v; want handed back for later, nothing spent",
			got.State, got.Attempts, got.ModelCalls, got.Lease, got.NotBefore)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 0 {
		t.Errorf("%d model calls with the project's budget unreadable, want none", calls)
	}
}

// bulletList answers as a digest must: its validator takes only bullet lists.
func bulletList(r geminitest.Request) geminitest.Reply {
	rep := geminitest.DefaultReply(r)
	rep.Text = "- " + rep.Text
	return rep
}

// tenantLimitsFunc is a TenantLimits.
type tenantLimitsFunc func(ctx context.Context, tenant string) (store.Limits, error)

func (f tenantLimitsFunc) Limits(ctx context.Context, tenant string) (store.Limits, error) {
	return f(ctx, tenant)
}

// spentFunc is a quota.SpendStore whose every total is 0, reported to f as it is read.
type spentFunc func(tenant string)

func (spentFunc) AddSpend(context.Context, quota.SpendFlush) error { return nil }

func (f spentFunc) Spent(_ context.Context, tenant, _, _ string) (float64, int64, error) {
	f(tenant)
	return 0, 0, nil
}

// A nudge names its task's tenant, and the worker starts the reads its model-call policy will
// make — the tenant's limits, its and the project's spend totals — as the message arrives, beside
// the claim rather than after it inside a model-call slot: here the task is not even claimable,
// and the reads were made all the same.
func TestPolicyReadsStartWithTheNudge(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	read := make(chan string, 3)
	mp := ModelPolicy{
		Tenants: tenantLimitsFunc(func(_ context.Context, tenant string) (store.Limits, error) {
			read <- "limits of " + tenant
			return store.Limits{}, nil
		}),
		Budgets:               quota.NewBudgets(spentFunc(func(tenant string) { read <- "total of " + tenant }), time.Now, time.Minute, quota.WithProjectLimit(100)),
		DefaultDailyBudgetUSD: 10,
	}
	h := b.policyHandler(t, policy("w1"), mp)
	m := msg("no-such-task")
	m.Attributes[task.AttrTenant] = "acme"
	if r := h.Handle(context.Background(), m); r != bus.Ack {
		t.Fatalf("a nudge of a missing task: %v, want ack", r)
	}
	var got []string
	for range 3 {
		select {
		case r := <-read:
			got = append(got, r)
		case <-time.After(10 * time.Second):
			t.Fatalf("reads %v, want the tenant's limits and the tenant's and the project's totals", got)
		}
	}
	slices.Sort(got)
	if want := []string{"limits of acme", "total of " + quota.ProjectCounter, "total of acme"}; !slices.Equal(got, want) {
		t.Errorf("reads %v, want %v", got, want)
	}
}

// While the project's spend counter cannot be read, a task waiting for a batch joins no job:
// nothing is reserved, and it keeps waiting for a later one.
func TestUnreadableProjectBudgetAdmitsNoBatchTask(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()
	mp := b.modelPolicy(quota.BudgetWait)
	mp.Budgets = quota.NewBudgets(unreadableProject{b.store}, time.Now, time.Minute, quota.WithProjectLimit(100))
	h := b.policyHandler(t, policy("w1"), mp)
	until := time.Now().Add(time.Hour)
	b.task(t, "waiting", func(d *protocol.Task) { d.Mode, d.BatchModel, d.NotBefore = task.ModeBatch, "m", &until })
	req, _, err := h.BatchRequest(b.get(t, "waiting"))
	if err != nil {
		t.Fatal(err)
	}
	if hold, ok := h.Admit(ctx, b.get(t, "waiting"), req, "m"); ok || hold != nil {
		t.Fatalf("admitted (hold %v) with the project's budget unreadable", hold)
	}
	if got := b.get(t, "waiting"); got.State != task.StateQueued || got.BatchModel != "m" {
		t.Errorf("state %s batch_model %q, want still waiting for a batch of m", got.State, got.BatchModel)
	}
}
