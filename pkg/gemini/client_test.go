package gemini_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

const (
	primary  = "model-a"
	fallback = "model-b"
)

// fakeClock advances only when the client sleeps, and records every sleep.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return ctx.Err()
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) recorded() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// breakerLog is a BreakerStore that counts its writes.
type breakerLog struct {
	mu      sync.Mutex
	changes []gemini.BreakerChange
}

func (l *breakerLog) SaveBreaker(_ context.Context, ch gemini.BreakerChange) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, ch)
	return nil
}

func (l *breakerLog) writes() []gemini.BreakerChange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]gemini.BreakerChange(nil), l.changes...)
}

type bundle struct {
	client  *gemini.Client
	srv     *geminitest.Server
	clock   *fakeClock
	store   *breakerLog
	alertMu sync.Mutex
	alerts  []string
}

func (b *bundle) alertKeys() []string {
	b.alertMu.Lock()
	defer b.alertMu.Unlock()
	return append([]string(nil), b.alerts...)
}

// testConfig is the production policy with a two-model chain of the fake's, pointed at srv.
func testConfig(t testing.TB, srv *geminitest.Server) gemini.Config {
	t.Helper()
	cfg := gemini.DefaultConfig()
	cfg.BaseURL = srv.URL
	cfg.Models = []string{primary, fallback}
	prices, err := gemini.ParsePrices(primary + "=1/2," + fallback + "=0.5/1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Prices = prices
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// setup starts a fake Gemini and a client on a fake clock; edit adjusts the config.
func setup(t *testing.T, edit func(*gemini.Config), fakeOpts ...geminitest.Option) *bundle {
	t.Helper()
	srv := geminitest.NewServer(fakeOpts...)
	t.Cleanup(srv.Close)
	cfg := testConfig(t, srv)
	if edit != nil {
		edit(&cfg)
	}
	b := &bundle{srv: srv, clock: &fakeClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}, store: &breakerLog{}}
	c, err := gemini.New(context.Background(), cfg,
		gemini.WithClock(b.clock),
		gemini.WithRand(func() float64 { return 0.5 }),
		gemini.WithBreakerStore(b.store),
		gemini.WithAlerts(func(_ context.Context, key, _ string) {
			b.alertMu.Lock()
			b.alerts = append(b.alerts, key)
			b.alertMu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	b.client = c
	return b
}

func request(id string) gemini.Request {
	temp := 0.8
	return gemini.Request{TaskID: id, Tenant: "t1", Prompt: "task " + id + ": say something", Config: task.GenConfig{Temperature: &temp}}
}

func TestPermanentErrorsAreCalledOnce(t *testing.T) {
	t.Parallel()
	for _, code := range []int{400, 401, 403, 404} {
		b := setup(t, nil)
		b.srv.FailNext(primary, code)
		res, err := b.client.Generate(context.Background(), request("p"))
		var ge *gemini.Error
		if !errors.As(err, &ge) || ge.Class != gemini.Permanent || ge.Code != code {
			t.Fatalf("code %d: err = %v, want a permanent *Error with that code", code, err)
		}
		if n := b.srv.Ledger().Total.Calls; n != 1 || res.Calls != 1 {
			t.Errorf("code %d: fake saw %d calls, result counts %d; want exactly one", code, n, res.Calls)
		}
	}
}

func TestSafetyBlockIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		return geminitest.Reply{Text: "", FinishReason: "SAFETY"}
	}))
	res, err := b.client.Generate(context.Background(), request("s"))
	if gemini.ClassOf(err) != gemini.Permanent || !errors.Is(err, gemini.ErrBlocked) {
		t.Fatalf("err = %v, want permanent ErrBlocked", err)
	}
	if n := b.srv.Ledger().Total.Calls; n != 1 {
		t.Errorf("fake saw %d calls, want 1", n)
	}
	if res.Usage.TotalTokens == 0 || res.CostUSD == 0 {
		t.Errorf("a blocked answer was billed; result records usage %+v cost %g", res.Usage, res.CostUSD)
	}
}

func TestRetryDelayIsHonored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, geminitest.WithRetryDelay(2*time.Second))
	b.srv.FailNext(primary, http.StatusTooManyRequests)
	res, err := b.client.Generate(context.Background(), request("r"))
	if err != nil {
		t.Fatal(err)
	}
	sleeps := b.clock.recorded()
	if len(sleeps) != 1 || sleeps[0] < 2*time.Second {
		t.Fatalf("sleeps before the retry = %v, want one of at least 2s", sleeps)
	}
	if res.Calls != 2 || res.Model != primary || res.Degraded {
		t.Errorf("result %+v, want 2 calls answered by the primary", res)
	}
}

// TestRetryDelayRealTime checks on the wall clock that the retry reaches the fake no earlier than
// the RetryInfo delay after the 429.
func TestRetryDelayRealTime(t *testing.T) {
	t.Parallel()
	const delay = 150 * time.Millisecond
	var mu sync.Mutex
	var at []time.Time
	srv := geminitest.NewServer(geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if r.Call == 0 {
			return geminitest.Reply{Code: http.StatusTooManyRequests, RetryDelay: delay}
		}
		return geminitest.DefaultReply(r)
	}))
	defer srv.Close()
	c, err := gemini.New(context.Background(), testConfig(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Generate(context.Background(), request("rt")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 2 {
		t.Fatalf("%d calls, want 2", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < delay {
		t.Errorf("retry %s after the 429, want at least %s", gap, delay)
	}
}

func TestTransientThenSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.srv.FailNext(primary, 503, 503, 503)
	res, err := b.client.Generate(context.Background(), request("t"))
	if err != nil {
		t.Fatal(err)
	}
	if n := b.srv.Ledger().Total.Calls; n != 4 || res.Calls != 4 {
		t.Errorf("fake saw %d calls, result counts %d; want 4", n, res.Calls)
	}
	if res.Degraded || res.Model != primary || res.Text == "" {
		t.Errorf("result %+v, want the primary's answer, not degraded", res)
	}
	// Full jitter: each wait is rand (0.5 here) times a doubling ceiling.
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}
	if got := b.clock.recorded(); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("backoff sleeps %v, want %v", got, want)
	}
	if res.Usage.TotalTokens == 0 || res.CostUSD <= 0 {
		t.Errorf("usage %+v cost %g, want the billed call counted", res.Usage, res.CostUSD)
	}
}

func TestFallbackWhenPrimaryAlwaysFails(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.srv.Outage(primary, time.Hour)
	res, err := b.client.Generate(context.Background(), request("f"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Degraded || res.Model != fallback {
		t.Errorf("result %+v, want the fallback's answer, degraded", res)
	}
	l := b.srv.Ledger()
	if a, f := l.Model(primary).Calls, l.Model(fallback).Calls; a != 4 || f != 1 {
		t.Errorf("calls primary %d fallback %d, want 4 (model attempts) and 1", a, f)
	}
}

func TestAttemptBudgetSpansTheChain(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) { c.MaxAttempts = 5 })
	b.srv.Outage(primary, time.Hour)
	b.srv.Outage(fallback, time.Hour)
	res, err := b.client.Generate(context.Background(), request("budget"))
	if gemini.ClassOf(err) != gemini.Transient {
		t.Fatalf("err = %v, want transient", err)
	}
	if n := b.srv.Ledger().Total.Calls; n != 5 || res.Calls != 5 {
		t.Errorf("fake saw %d calls, result %d; want the budget of 5", n, res.Calls)
	}
}

func TestSDKDoesNotRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) { c.MaxAttempts = 1 })
	b.srv.FailNext(primary, 503, 503)
	if _, err := b.client.Generate(context.Background(), request("sdk")); gemini.ClassOf(err) != gemini.Transient {
		t.Fatalf("err = %v, want transient", err)
	}
	if n := b.srv.Ledger().Total.Calls; n != 1 {
		t.Errorf("fake saw %d calls for a budget of one: the SDK retried", n)
	}
}

func TestNetworkErrorIsInDoubt(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) {
		c.CallTimeout = 20 * time.Millisecond
		c.MaxAttempts = 1
	}, geminitest.WithLatency(primary, geminitest.Fixed(300*time.Millisecond)))
	res, err := b.client.Generate(context.Background(), request("n"))
	if gemini.ClassOf(err) != gemini.Network {
		t.Fatalf("err = %v, want network", err)
	}
	if res.InDoubt.TotalTokens == 0 || res.CostUSD == 0 {
		t.Errorf("in doubt %+v cost %g, want the call estimated", res.InDoubt, res.CostUSD)
	}
}

func TestCallerCancelIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, geminitest.WithLatency(primary, geminitest.Fixed(5*time.Second)))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := b.client.Generate(ctx, request("c"))
	if !errors.Is(err, context.DeadlineExceeded) || gemini.ClassOf(err) != "" {
		t.Fatalf("err = %v, want the caller's ctx.Err() unclassified", err)
	}
	if len(b.store.writes()) != 0 {
		t.Errorf("the caller's cancel moved a breaker: %v", b.store.writes())
	}
}

func TestMaxCostRefusesBeforeAnyCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	req := request("cost")
	tokens, est := b.client.Estimate(req)
	if tokens <= 0 || est <= 0 {
		t.Fatalf("estimate %d tokens $%g, want positive", tokens, est)
	}
	req.MaxCostUSD = est / 2
	_, err := b.client.Generate(context.Background(), req)
	if gemini.ClassOf(err) != gemini.Budget {
		t.Fatalf("err = %v, want budget", err)
	}
	if n := b.srv.Ledger().Total.Calls; n != 0 {
		t.Errorf("fake saw %d calls, want none", n)
	}
	req.MaxCostUSD = est * 2
	if _, err := b.client.Generate(context.Background(), req); err != nil {
		t.Errorf("within max_cost_usd: %v", err)
	}
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	b.srv.Outage(primary, time.Hour)

	// 4 failures on the primary, then the fallback: the primary's breaker is not open yet.
	if res, err := b.client.Generate(ctx, request("1")); err != nil || !res.Degraded {
		t.Fatalf("first: %+v %v", res, err)
	}
	if w := b.store.writes(); len(w) != 0 {
		t.Fatalf("breaker writes after 4 failures: %v", w)
	}
	// The fifth consecutive failure opens it.
	if _, err := b.client.Generate(ctx, request("2")); err != nil {
		t.Fatal(err)
	}
	w := b.store.writes()
	if len(w) != 1 || w[0].Model != primary || w[0].To != gemini.BreakerOpen {
		t.Fatalf("breaker writes %v, want one: %s open", w, primary)
	}
	if a := b.alertKeys(); len(a) != 1 || a[0] != "breaker:"+primary {
		t.Errorf("alerts %v, want one for %s", a, primary)
	}
	// Open: skipped, no call to the primary.
	before := b.srv.Ledger().Model(primary).Calls
	if res, err := b.client.Generate(ctx, request("3")); err != nil || !res.Degraded || res.Calls != 1 {
		t.Fatalf("open primary: %+v %v, want one call to the fallback", res, err)
	}
	if after := b.srv.Ledger().Model(primary).Calls; after != before {
		t.Errorf("open breaker let %d calls through", after-before)
	}

	// Every model open: ErrUnavailable without a call.
	b.srv.Outage(fallback, time.Hour)
	for i := 0; i < 3; i++ {
		_, _ = b.client.Generate(ctx, request("x"))
	}
	if b.client.Available(nil) {
		t.Fatal("Available with every breaker open")
	}
	calls := b.srv.Ledger().Total.Calls
	res, err := b.client.Generate(ctx, request("4"))
	if !errors.Is(err, gemini.ErrUnavailable) || res.Calls != 0 {
		t.Fatalf("all open: %+v %v, want ErrUnavailable and no call", res, err)
	}
	if n := b.srv.Ledger().Total.Calls; n != calls {
		t.Errorf("all open made %d calls", n-calls)
	}
	writes := len(b.store.writes())
	if writes != 2 {
		t.Errorf("%d breaker writes, want 2 (each model opened once): %v", writes, b.store.writes())
	}

	// After the cooldown a single probe passes; its success closes the breaker.
	b.srv.Restore(primary)
	b.clock.advance(time.Minute)
	if !b.client.Available(nil) {
		t.Fatal("not available after the cooldown")
	}
	res, err = b.client.Generate(ctx, request("5"))
	if err != nil || res.Model != primary || res.Degraded {
		t.Fatalf("probe: %+v %v, want the primary's answer", res, err)
	}
	w = b.store.writes()[writes:]
	if len(w) != 2 || w[0].To != gemini.BreakerHalfOpen || w[1].To != gemini.BreakerClosed {
		t.Fatalf("writes after the probe %v, want half_open then closed", w)
	}
	// Closed again: no more writes while calls succeed.
	for i := 0; i < 3; i++ {
		if _, err := b.client.Generate(ctx, request("6")); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.store.writes()); n != writes+2 {
		t.Errorf("%d writes, want %d: written only on state changes", n, writes+2)
	}
	if a := b.alertKeys(); len(a) != 2 {
		t.Errorf("alerts %v, want one per model that opened", a)
	}
}

func TestFailedProbeReopens(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) { c.Models = []string{primary} })
	ctx := context.Background()
	b.srv.Outage(primary, time.Hour)
	for i := 0; i < 2; i++ {
		_, _ = b.client.Generate(ctx, request("o"))
	}
	if _, err := b.client.Generate(ctx, request("o")); !errors.Is(err, gemini.ErrUnavailable) {
		t.Fatalf("err = %v, want unavailable", err)
	}
	calls := b.srv.Ledger().Total.Calls
	b.clock.advance(time.Minute)
	_, err := b.client.Generate(ctx, request("probe"))
	if gemini.ClassOf(err) != gemini.Transient {
		t.Fatalf("probe err = %v, want transient", err)
	}
	if n := b.srv.Ledger().Total.Calls - calls; n != 1 {
		t.Errorf("half-open let %d calls through, want exactly the probe", n)
	}
	w := b.store.writes()
	if got := w[len(w)-1]; got.From != gemini.BreakerHalfOpen || got.To != gemini.BreakerOpen {
		t.Errorf("last write %+v, want half_open -> open", got)
	}
	if len(b.alertKeys()) != 1 {
		t.Errorf("alerts %v: a failed probe must not alert again", b.alertKeys())
	}
}

// A call made before the breaker opened that fails late — here it times out while the half-open
// probe is in flight — says nothing about the probe: the probe's success closes the breaker.
// Crediting the late failure to the probe reopened the breaker, and the probe's success was then
// dropped: the model stayed skipped for another cooldown though it had answered.
func TestLateFailureIsNotTheProbes(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) {
		c.Models = []string{primary}
		c.MaxAttempts, c.ModelAttempts = 1, 1
		c.Breaker.ConsecutiveFailures = 1
		c.CallTimeout = 2 * time.Second
	})
	ctx := context.Background()
	gate := b.srv.Block(primary)
	defer gate.Release()
	late := make(chan error, 1)
	go func() { _, err := b.client.Generate(ctx, request("late")); late <- err }()
	<-gate.Entered()

	b.srv.Outage(primary, time.Hour)
	if _, err := b.client.Generate(ctx, request("opens")); gemini.ClassOf(err) != gemini.Transient {
		t.Fatalf("during the outage: %v, want a transient failure", err)
	}
	b.srv.Restore(primary)
	b.clock.advance(time.Hour) // the cooldown has passed: the next call is the probe
	// The probe starts half a call timeout after the late call, so that once the late one has
	// timed out it still has that long to answer before its own timeout, however slow the
	// machine: started at once, it timed out as soon after the late one as the outage's call took.
	time.Sleep(time.Second)
	probe := make(chan error, 1)
	go func() { _, err := b.client.Generate(ctx, request("probe")); probe <- err }()
	<-gate.Entered()
	if err := <-late; gemini.ClassOf(err) != gemini.Network {
		t.Fatalf("the late call: %v, want its timeout", err)
	}
	gate.Release()
	if err := <-probe; err != nil {
		t.Fatalf("probe: %v", err)
	}
	if res, err := b.client.Generate(ctx, request("after")); err != nil || res.Model != primary {
		t.Errorf("after the probe succeeded: %+v %v, want the model's answer", res, err)
	}
}

// A generation whose own probe failed while the only other model's probe is in flight elsewhere
// ends unavailable: the caller parks the task instead of spending an attempt on the outage, and
// the chain is not available while that probe is out.
func TestChainUnavailableWhileAnotherProbes(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *gemini.Config) {
		c.MaxAttempts, c.ModelAttempts = 2, 1
		c.Breaker.ConsecutiveFailures = 1
	})
	ctx := context.Background()
	b.srv.Outage(primary, time.Hour)
	b.srv.Outage(fallback, time.Hour)
	if _, err := b.client.Generate(ctx, request("opens")); gemini.ClassOf(err) != gemini.Transient {
		t.Fatalf("during the outage: %v, want a transient failure", err)
	}
	b.clock.advance(time.Hour) // both breakers may probe
	b.srv.Restore(fallback)
	gate := b.srv.Block(fallback)
	defer gate.Release()
	probing := make(chan error, 1)
	go func() {
		req := request("probes-the-fallback")
		req.Models = []string{fallback}
		_, err := b.client.Generate(ctx, req)
		probing <- err
	}()
	<-gate.Entered()
	_, err := b.client.Generate(ctx, request("probes-the-primary"))
	if !errors.Is(err, gemini.ErrUnavailable) {
		t.Errorf("own probe failed, the other model's probe in flight: %v, want ErrUnavailable", err)
	}
	if b.client.Available(nil) {
		t.Error("the chain is available while one breaker reopened and the other's probe is in flight")
	}
	gate.Release()
	if err := <-probing; err != nil {
		t.Fatalf("the fallback's probe: %v", err)
	}
	if !b.client.Available(nil) {
		t.Error("the chain is not available after the fallback's probe succeeded")
	}
}

// sharedBreakers is a BreakerStore shared by several clients, as breakers/{model} is by several
// instances: it applies a change only over the generation it was made from, and passes what it
// stored to every client (the instances' snapshot listener) unless quiet.
type sharedBreakers struct {
	mu      sync.Mutex
	stored  map[string]gemini.BreakerStatus
	clients []*gemini.Client
	quiet   bool
}

func (s *sharedBreakers) SaveBreaker(_ context.Context, ch gemini.BreakerChange) error {
	s.mu.Lock()
	if s.stored[ch.Model].Generation != ch.Generation-1 {
		s.mu.Unlock()
		return gemini.ErrBreakerMoved
	}
	st := gemini.BreakerStatus{Model: ch.Model, State: ch.To, Generation: ch.Generation, Since: ch.At, RetryAt: ch.RetryAt}
	s.stored[ch.Model] = st
	clients := s.clients
	if s.quiet {
		clients = nil
	}
	s.mu.Unlock()
	for _, c := range clients {
		c.ObserveBreaker(st)
	}
	return nil
}

func (s *sharedBreakers) setQuiet(q bool) {
	s.mu.Lock()
	s.quiet = q
	s.mu.Unlock()
}

// Two instances share their breakers: the outage one saw holds the other's calls back without a
// call; one probe serves both, even when both try to take it; and its success closes both.
func TestInstancesShareOneBreaker(t *testing.T) {
	t.Parallel()
	srv := geminitest.NewServer()
	t.Cleanup(srv.Close)
	cfg := testConfig(t, srv)
	cfg.Models, cfg.MaxAttempts, cfg.ModelAttempts, cfg.Breaker.ConsecutiveFailures = []string{primary}, 2, 2, 2
	clock := &fakeClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	shared := &sharedBreakers{stored: map[string]gemini.BreakerStatus{}}
	var a, b *gemini.Client
	for _, c := range []**gemini.Client{&a, &b} {
		var err error
		if *c, err = gemini.New(context.Background(), cfg, gemini.WithClock(clock), gemini.WithRand(func() float64 { return 0.5 }), gemini.WithBreakerStore(shared)); err != nil {
			t.Fatal(err)
		}
		shared.clients = append(shared.clients, *c)
	}
	ctx := context.Background()
	calls := func() int { return srv.Ledger().Total.Calls }

	srv.Outage(primary, time.Hour)
	if _, err := a.Generate(ctx, request("opens")); gemini.ClassOf(err) != gemini.Transient {
		t.Fatalf("a during the outage: %v", err)
	}
	if _, err := b.Generate(ctx, request("held")); !errors.Is(err, gemini.ErrUnavailable) || calls() != 2 {
		t.Fatalf("b after a's breaker opened: %v after %d calls, want ErrUnavailable and a's 2 calls only", err, calls())
	}

	srv.Restore(primary)
	gate := srv.Block(primary)
	defer gate.Release()
	clock.advance(time.Hour)
	shared.setQuiet(true) // b has not heard of a's probe yet when it tries to take one too
	probe := make(chan error, 1)
	go func() { _, err := a.Generate(ctx, request("probe")); probe <- err }()
	<-gate.Entered()
	if _, err := b.Generate(ctx, request("second-probe")); !errors.Is(err, gemini.ErrUnavailable) {
		t.Errorf("b while a's probe is in flight: %v, want ErrUnavailable", err)
	}
	shared.setQuiet(false)
	gate.Release()
	if err := <-probe; err != nil {
		t.Fatalf("a's probe: %v", err)
	}
	if n := calls(); n != 3 {
		t.Errorf("%d calls, want a's 2 failures and one probe", n)
	}
	if res, err := b.Generate(ctx, request("after")); err != nil || res.Model != primary {
		t.Errorf("b after a's probe succeeded: %+v %v, want the model's answer", res, err)
	}
}

// Calls at once reuse their connections to the model's host: a second round of as many calls as
// the first opens none, where net/http's default pool of two idle connections closed all but two
// after each round (over HTTP/1.1, as to the fake), and every call of the next dialed again.
func TestConcurrentCallsReuseConnections(t *testing.T) {
	t.Parallel()
	fake := geminitest.New(geminitest.WithLatency(primary, geminitest.Fixed(20*time.Millisecond)))
	srv := httptest.NewUnstartedServer(fake)
	var dialed atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(func() { fake.Close(); srv.Close() })
	cfg := gemini.DefaultConfig()
	cfg.BaseURL, cfg.Models = srv.URL, []string{primary}
	c, err := gemini.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	const calls = 32
	for round := range 2 {
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() {
				if _, err := c.Generate(t.Context(), gemini.Request{TaskID: fmt.Sprintf("t-%d-%d", round, i), Tenant: "acme", Prompt: "say something"}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if got := dialed.Load(); got > calls {
		t.Errorf("%d connections for two rounds of %d calls at once, want at most %d: the second round dialed again", got, calls, calls)
	}
}
