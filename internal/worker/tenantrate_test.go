package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/internal/testenv"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/prompts"
	"github.com/genbox-dev/genbox/pkg/task"
)

// A task whose tenant has used its rpm is handed back before any call, with no attempt counted
// and not_before when its tenant has room; a tenant without rpm or tpm runs as before.
func TestTenantRateHandsBackWithoutACall(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{RPM: 1})
	b.tenant(t, "tenant-b", store.Limits{})
	mp := b.modelPolicy(quota.BudgetWait)
	now := time.Now().Truncate(time.Second) // a slot's start: the clock stands still, and a call is not made in a slot's last tenth
	mp.Rates = quota.NewTenantRates(b.store, func() time.Time { return now }, time.Minute)
	h := b.policyHandler(t, policy("w1"), mp)
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		b.task(t, id, func(d *protocol.Task) { d.Tenant = "tenant-" + id[:1] })
		h.Handle(context.Background(), msg(id))
	}
	type view struct {
		State    task.State
		Attempts int
		Waiting  bool
	}
	got := map[string]view{}
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		d := b.get(t, id)
		got[id] = view{State: d.State, Attempts: d.Attempts, Waiting: d.NotBefore != nil}
	}
	want := map[string]view{
		"a1": {State: task.StateSucceeded},
		"a2": {State: task.StateQueued, Waiting: true},
		"b1": {State: task.StateSucceeded},
		"b2": {State: task.StateSucceeded},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tasks (-want +got):\n%s", diff)
	}
	if calls := b.srv.Ledger().Total.Calls; calls != 3 {
		t.Errorf("%d model calls, want 3: none for the task handed back", calls)
	}
}

// A task whose tenant's room opens within a burst waits for it in process instead of being
// handed back, and gives its model-call slot up meanwhile: another tenant's task calls on the
// instance's one slot while it waits. Slots here are 500 ms (a window of 30.5 s), a burst 10
// calls, whose room opens again 5 s after its first.
func TestTenantRateWaitsInProcessWithoutItsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{RPM: 61}) // a share: 1 call
	b.tenant(t, "tenant-b", store.Limits{})
	mp := b.modelPolicy(quota.BudgetWait)
	mp.Rates = quota.NewTenantRates(b.store, time.Now, (quota.RateSlots+1)*500*time.Millisecond)
	h := b.handler(policy("w1"), chain("m"), WithModelPolicy(mp), WithCapacity(1, 1, 4))
	ctx := context.Background()
	for i := range quota.RateBurst {
		id := fmt.Sprintf("a%d", i)
		b.task(t, id, func(d *protocol.Task) { d.Tenant = "tenant-a" })
		h.Handle(ctx, tenantMsg(id, "tenant-a"))
	}
	b.task(t, "a-last", func(d *protocol.Task) { d.Tenant = "tenant-a" })
	b.task(t, "b1", func(d *protocol.Task) { d.Tenant = "tenant-b" })
	waited := make(chan struct{})
	go func() { defer close(waited); h.Handle(ctx, tenantMsg("a-last", "tenant-a")) }()
	for b.get(t, "a-last").State != task.StateRunning {
		time.Sleep(10 * time.Millisecond)
	}
	h.Handle(ctx, tenantMsg("b1", "tenant-b"))
	select {
	case <-waited:
		t.Error("the other tenant's task called only after the waiting task: the wait held the call slot")
	default:
	}
	<-waited
	for _, id := range []string{"a-last", "b1"} {
		if d := b.get(t, id); d.State != task.StateSucceeded || d.NotBefore != nil {
			t.Errorf("%s is %s (not_before %v), want succeeded without being handed back", id, d.State, d.NotBefore)
		}
	}
}

// grantLog is the store's RateStore, recording the requests its leases granted, less those
// given back.
type grantLog struct {
	quota.RateStore
	mu   sync.Mutex
	held int64
}

func (g *grantLog) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	gr, err := g.RateStore.LeaseRate(ctx, l)
	if err == nil {
		g.mu.Lock()
		g.held += gr.Got.Requests
		for _, u := range l.Returns {
			g.held -= u.Requests
		}
		g.mu.Unlock()
	}
	return gr, err
}

// A retry inside one generation is a model call too: it takes its own call from the tenant's
// rpm before it is made, waiting for room (one call a window, here of 6.1 s: its slots, 100 ms,
// longer than a lease takes, as a lease answering after its slot is asked again).
func TestTenantRateRetryTakesItsOwnCall(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.tenant(t, "tenant-a", store.Limits{RPM: 1})
	mp := b.modelPolicy(quota.BudgetWait)
	leases := &grantLog{RateStore: b.store}
	mp.Rates = quota.NewTenantRates(leases, time.Now, (quota.RateSlots+1)*100*time.Millisecond)
	h := b.policyHandler(t, policy("w1"), mp)
	b.srv.FailNext("m", 503)
	b.task(t, "a1")
	h.Handle(context.Background(), msg("a1"))
	if got := b.get(t, "a1"); got.State != task.StateSucceeded || got.ModelCalls != 2 {
		t.Fatalf("task %s after %d model calls, want succeeded after 2", got.State, got.ModelCalls)
	}
	time.Sleep(100 * time.Millisecond) // a slot: the instance gives back what the last one left
	if err := mp.Rates.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	leases.mu.Lock()
	defer leases.mu.Unlock()
	if leases.held != 2 {
		t.Errorf("the leases hold %d calls of the tenant's rpm, want 2: one per model call", leases.held)
	}
}

// rateInstance is one worker instance of a deployment sharing b's emulator project and fake
// Gemini: its own Firestore client, Gemini client, tenant limits, budgets and TenantRates (whose
// limits count per window, its unused allowance given back every sixth of it, as
// GENBOX_TENANT_REFRESH is of a minute), and its own Handler. Its family asks for at most 16
// output tokens, so that a call's worst case (3 prompt tokens and those 16) is what it uses.
func (b *bundle) rateInstance(tb testing.TB, owner string, window time.Duration, leases *leaseCount, sends *sendLog) *Handler {
	tb.Helper()
	ctx, stop := context.WithCancel(context.Background())
	st := store.New(testenv.Firestore(tb, b.project))
	st.MaxAttempts = 20
	gen := geminiClient(ctx, tb, b.srv.URL, nil, gemini.WithHTTPClient(&http.Client{Transport: sends}))
	mp := ModelPolicy{
		Estimator: gen, Tenants: NewTenantCache(st, time.Minute),
		Budgets: quota.NewBudgets(st, time.Now, time.Minute), BudgetPolicy: quota.BudgetWait, BudgetRetry: time.Hour,
		Rates: quota.NewTenantRates(leases.of(st), time.Now, window),
	}
	done := make(chan struct{})
	go func() { defer close(done); FlushRates(ctx, b.log, mp.Rates, window/6) }()
	tb.Cleanup(func() { stop(); <-done })
	out := int32(16)
	short := fakeRenderer{RenderFunc: func(_, _, input string, _ *task.GenConfig) (*prompts.Rendered, error) {
		return &prompts.Rendered{Prompt: input, Models: []string{"m"}, Config: task.GenConfig{MaxOutputTokens: &out}}, nil
	}}
	return New(st, gen, short, b.pub, b.log.With("owner", owner), policy(owner), WithModelPolicy(mp))
}

// leaseCount counts the transactions of the RateStores it wraps: a lease or a giving back, each
// one read and one write of the tenant's document.
type leaseCount struct{ n atomic.Int64 }

func (c *leaseCount) of(s quota.RateStore) quota.RateStore { return countedRates{s, c} }

type countedRates struct {
	quota.RateStore
	c *leaseCount
}

func (s countedRates) LeaseRate(ctx context.Context, l quota.RateLease) (quota.RateGrant, error) {
	s.c.n.Add(1)
	return s.RateStore.LeaseRate(ctx, l)
}

// rateDrain is what a drain of a backlog under a tenant's rpm or tpm measured at the fake.
type rateDrain struct {
	window    time.Duration
	limit     int64      // the limit per window: calls (rpm) or tokens (tpm)
	calls     []rateCall // each billed call, in the order they reached the fake
	handBacks int64      // the tasks' nudges that ended with the task handed back
	leases    int64      // the instances' transactions of the tenant's rate document
}

// rateCall is one billed call: when it left its instance and reached the fake, and what it
// counts against the limit.
type rateCall struct {
	sent, arrived time.Time
	counts        int64 // 1 under an rpm, its tokens under a tpm
}

// windows returns what each window of the drain held, the calls timed by at — every window
// wholly inside the drain, starting every 10 ms from the first call — and the most any window
// held, wherever it starts.
func (d rateDrain) windows(at func(rateCall) time.Time) (inside []int64, most int64) {
	calls := slices.Clone(d.calls)
	slices.SortFunc(calls, func(a, b rateCall) int { return at(a).Compare(at(b)) })
	sums := make([]int64, len(calls)+1) // sums[i]: what the calls before the i-th count
	for i, c := range calls {
		sums[i+1] = sums[i] + c.counts
	}
	from := func(t time.Time) int {
		i, _ := slices.BinarySearchFunc(calls, t, func(c rateCall, t time.Time) int { return at(c).Compare(t) })
		return i
	}
	for i, c := range calls {
		most = max(most, sums[from(at(c).Add(d.window))]-sums[i])
	}
	first, last := at(calls[0]), at(calls[len(calls)-1])
	for a := first; !a.Add(d.window).After(last); a = a.Add(10 * time.Millisecond) {
		inside = append(inside, sums[from(a.Add(d.window))]-sums[from(a)])
	}
	return inside, most
}

func sent(c rateCall) time.Time    { return c.sent }
func arrived(c rateCall) time.Time { return c.arrived }

// sendLog is the rate instances' Gemini transport: it records when each task's generation left
// its instance — the time the limiter counts the call at, where the fake's ledger has when it
// arrived, later by the way there (on a machine as loaded as a test's under -race, sometimes
// more than a slot).
type sendLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	sent map[string]time.Time // by the task's prompt
}

// taskPrompt is a drain's task's prompt, in a generation's request body.
var taskPrompt = regexp.MustCompile(`summarize r-\d+`)

func (l *sendLog) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && strings.HasSuffix(req.URL.Path, ":generateContent") {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if p := taskPrompt.Find(body); p != nil {
			l.mu.Lock()
			l.sent[string(p)] = time.Now()
			l.mu.Unlock()
		}
	}
	return l.next.RoundTrip(req)
}

// drainAtRate drains a backlog of n tasks of a tenant with limits (an rpm or a tpm, per window)
// through two worker instances — each with its own Firestore client, Gemini client and Handler.
// Each task is first nudged at either instance; a task handed back for want of room is nudged
// again at the first sweep pass after its not_before (a pass every twelfth of the window, as the
// default GENBOX_SWEEP_INTERVAL, 5 s, is of a minute), at the first instance, as the sweep's
// leader hands what it finds due to its own instance first. The window is shortened to 20 s (its
// slots to 333 ms); the limits count per window.
func drainAtRate(tb testing.TB, limits store.Limits, n int) rateDrain {
	tb.Helper()
	const window = 20 * time.Second
	b := setup(tb, 20*time.Millisecond)
	b.tenant(tb, "tenant-r", limits)
	var leases leaseCount
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 100
	sends := &sendLog{next: tr, sent: map[string]time.Time{}}
	hs := []*Handler{b.rateInstance(tb, "w1", window, &leases, sends), b.rateInstance(tb, "w2", window, &leases, sends)}
	var nudges atomic.Int64
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("r-%03d", i)
		b.task(tb, ids[i], func(d *protocol.Task) { d.Tenant = "tenant-r" })
	}
	ctx := context.Background()
	start := time.Now()
	giveUp := start.Add(4 * time.Minute)
	const sweep = window / 12
	pass := func(t time.Time) time.Time { return start.Add((t.Sub(start) + sweep - 1) / sweep * sweep) }
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			for h := hs[i%2]; time.Now().Before(giveUp); h = hs[0] {
				h.Handle(ctx, tenantMsg(id, "tenant-r"))
				nudges.Add(1)
				d, err := b.store.GetTask(ctx, id)
				switch {
				case err != nil:
					tb.Error(err)
					return
				case d.State == task.StateSucceeded:
					return
				case d.State == task.StateQueued && d.NotBefore != nil:
					time.Sleep(time.Until(pass(*d.NotBefore)))
				case d.State != task.StateQueued:
					tb.Errorf("%s is %s, want succeeded, or queued until its tenant has room", id, d.State)
					return
				}
			}
			tb.Errorf("%s not done in 4 minutes", id)
		})
	}
	wg.Wait()
	d := rateDrain{window: window, limit: limits.RPM, handBacks: nudges.Load() - int64(n), leases: leases.n.Load()}
	if limits.TPM > 0 {
		d.limit = limits.TPM
	}
	for _, bill := range b.srv.Ledger().Bills {
		c := rateCall{sent: sends.sent[bill.Request.Prompt], arrived: bill.Started, counts: 1}
		if limits.TPM > 0 {
			c.counts = int64(bill.Usage.TotalTokens)
		}
		d.calls = append(d.calls, c)
	}
	if len(d.calls) != n {
		tb.Fatalf("%d calls billed for %d tasks, want one each", len(d.calls), n)
	}
	return d
}

// rateLimits are the limits the drains run under, per window of 20 s: 200 calls, or the tokens
// of about 200 calls (each of 3 prompt and 16 output tokens at most, 19 in all).
var rateLimits = []struct {
	name   string
	limits store.Limits
}{
	{"rpm", store.Limits{RPM: 200}},
	{"tpm", store.Limits{TPM: 200 * 19}},
}

// Issue 32's rpm and tpm promise end to end, its safety half: two worker instances draining a
// backlog of a tenant with an rpm or a tpm (drainAtRate) bill each task once, and no window
// holds more than the limit as the calls were sent (the limiter's clock; at the fake, a call on
// its way longer than a slot can pass it, which this test's load under -race makes happen). How close to the limit the
// backlog runs is a figure of BenchmarkTenantRateAcrossTwoWorkers.
func TestTenantRateAcrossTwoWorkers(t *testing.T) {
	t.Parallel()
	for _, tc := range rateLimits {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := drainAtRate(t, tc.limits, 300)
			inside, most := d.windows(sent)
			if most > d.limit {
				t.Errorf("a window of %s held %d as the calls were sent, above the limit %d", d.window, most, d.limit)
			}
			_, atModel := d.windows(arrived)
			t.Logf("%d calls; the windows inside the drain held %.3f of the limit on average; the fullest %d of %d (%d as the calls arrived)",
				len(d.calls), meanOf(inside)/float64(d.limit), most, d.limit, atModel)
		})
	}
}

// BenchmarkTenantRateAcrossTwoWorkers reports, per drain of drainAtRate of 600 tasks (three
// windows' worth), what the windows wholly inside the drain held at the fake on average and at
// the least, and what the fullest window held there and as the calls were sent, each as a part
// of the limit; the times a task was handed
// back; and the transactions (a read and a write each) on the tenant's rate document per call.
func BenchmarkTenantRateAcrossTwoWorkers(b *testing.B) {
	for _, tc := range rateLimits {
		b.Run(tc.name, func(b *testing.B) {
			var d rateDrain
			for b.Loop() {
				d = drainAtRate(b, tc.limits, 600)
			}
			inside, most := d.windows(arrived)
			_, sentMost := d.windows(sent)
			b.ReportMetric(meanOf(inside)/float64(d.limit), "mean-window/limit")
			b.ReportMetric(float64(slices.Min(inside))/float64(d.limit), "min-window/limit")
			b.ReportMetric(float64(most)/float64(d.limit), "max-window/limit")
			b.ReportMetric(float64(sentMost)/float64(d.limit), "max-sent-window/limit")
			b.ReportMetric(float64(d.handBacks)/float64(len(d.calls)), "hand-backs/task")
			b.ReportMetric(float64(d.leases)/float64(len(d.calls)), "lease-txns/call")
		})
	}
}

// meanOf is the mean of ns.
func meanOf(ns []int64) float64 {
	var sum int64
	for _, n := range ns {
		sum += n
	}
	return float64(sum) / float64(len(ns))
}
