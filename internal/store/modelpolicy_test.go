package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestBreakerDocuments(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	chain := []string{"m-a", "models/m-b"}
	if st, err := s.ChainState(ctx, chain, now); err != nil || !st.Closed {
		t.Fatalf("fresh chain: %+v %v, want closed", st, err)
	}
	for _, m := range chain {
		if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: m, From: gemini.BreakerClosed, To: gemini.BreakerOpen, At: now, RetryAt: now.Add(time.Minute), Reason: "5 consecutive failures", Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	bs, err := s.Breakers(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	if b := bs["models/m-b"]; b.State != "open" || b.RetryAt == nil || !b.RetryAt.Equal(now.Add(time.Minute)) || b.Generation != 1 {
		t.Errorf("breaker doc %+v", b)
	}
	if st, _ := s.ChainState(ctx, chain, now.Add(30*time.Second)); st.Closed || st.Probe || !st.RetryAt.Equal(now.Add(time.Minute)) {
		t.Errorf("every model open: %+v, want held until the retry time", st)
	}
	if st, _ := s.ChainState(ctx, chain, now.Add(time.Minute)); st.Closed || !st.Probe {
		t.Errorf("past the retry time: %+v, want a probe", st)
	}
	// A probe in flight holds the chain until it is overdue.
	if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: "m-a", From: gemini.BreakerOpen, To: gemini.BreakerHalfOpen, At: now.Add(time.Minute), RetryAt: now.Add(2 * time.Minute), Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: "models/m-b", From: gemini.BreakerOpen, To: gemini.BreakerOpen, At: now.Add(time.Minute), RetryAt: now.Add(3 * time.Minute), Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.ChainState(ctx, chain, now.Add(90*time.Second)); st.Closed || st.Probe || !st.RetryAt.Equal(now.Add(2*time.Minute)) {
		t.Errorf("a probe in flight: %+v, want held until it is overdue", st)
	}
	if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: "m-a", From: gemini.BreakerHalfOpen, To: gemini.BreakerClosed, At: now, Generation: 3}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.ChainState(ctx, chain, now.Add(time.Second)); !st.Closed {
		t.Errorf("one model closed: %+v, want closed", st)
	}
}

// Two instances change one breaker from the same generation — both saw the cooldown pass and
// both want to probe — or one's change arrives after a newer one: only a change over the stored
// generation is applied, so at most one probes and a late change never overwrites a newer state.
func TestBreakerChangesApplyInGenerationOrder(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	open := gemini.BreakerChange{Model: "m", From: gemini.BreakerClosed, To: gemini.BreakerOpen, At: now, RetryAt: now.Add(time.Minute), Generation: 1}
	if err := s.SaveBreaker(ctx, open); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBreaker(ctx, open); !errors.Is(err, gemini.ErrBreakerMoved) {
		t.Errorf("the same change again: %v, want ErrBreakerMoved", err)
	}
	const instances = 4
	var wg sync.WaitGroup
	won := make(chan int, instances)
	for i := range instances {
		wg.Go(func() {
			probe := gemini.BreakerChange{Model: "m", From: gemini.BreakerOpen, To: gemini.BreakerHalfOpen, At: now.Add(time.Minute), RetryAt: now.Add(2 * time.Minute), Generation: 2, Reason: string(rune('a' + i))}
			switch err := s.SaveBreaker(ctx, probe); {
			case err == nil:
				won <- i
			case !errors.Is(err, gemini.ErrBreakerMoved):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(won)
	if n := len(won); n != 1 {
		t.Fatalf("%d instances took the probe, want 1", n)
	}
	closed := gemini.BreakerChange{Model: "m", From: gemini.BreakerHalfOpen, To: gemini.BreakerClosed, At: now.Add(70 * time.Second), Generation: 3}
	if err := s.SaveBreaker(ctx, closed); err != nil {
		t.Fatal(err)
	}
	late := gemini.BreakerChange{Model: "m", From: gemini.BreakerHalfOpen, To: gemini.BreakerOpen, At: now.Add(65 * time.Second), RetryAt: now.Add(2 * time.Minute), Generation: 3, Reason: "late"}
	if err := s.SaveBreaker(ctx, late); !errors.Is(err, gemini.ErrBreakerMoved) {
		t.Errorf("a late change of the same generation: %v, want ErrBreakerMoved", err)
	}
	bs, err := s.Breakers(ctx, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	if b := bs["m"]; b.State != string(gemini.BreakerClosed) || b.Generation != 3 || b.RetryAt != nil {
		t.Errorf("stored %+v, want closed at generation 3", b)
	}
}

// The snapshot listener hands every stored breaker to its observers and signals a change, and
// answers for a chain once it has read the breakers.
func TestBreakerWatchFollowsTheDocuments(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	w := s.WatchBreakers(slog.New(slog.DiscardHandler))
	seen := make(chan gemini.BreakerStatus, 16)
	w.Observe(func(st gemini.BreakerStatus) { seen <- st })
	changed := w.Changed()
	if _, err := w.ChainState(ctx, []string{"m"}, time.Now()); !errors.Is(err, store.ErrBreakersUnknown) {
		t.Fatalf("before the listener read anything: %v, want ErrBreakersUnknown", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { stop(); <-done }()
	<-changed
	now := time.Now().UTC()
	if st, err := w.ChainState(ctx, []string{"m"}, now); err != nil || !st.Closed {
		t.Fatalf("no breaker stored: %+v %v, want closed", st, err)
	}
	changed = w.Changed()
	if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: "m", From: gemini.BreakerClosed, To: gemini.BreakerOpen, At: now, RetryAt: now.Add(time.Hour), Generation: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no change signalled after a breaker opened")
	}
	select {
	case st := <-seen:
		if st.Model != "m" || st.State != gemini.BreakerOpen || st.Generation != 1 || !st.RetryAt.Equal(now.Add(time.Hour).Truncate(time.Microsecond)) {
			t.Errorf("observed %+v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the open breaker was not observed")
	}
	if st, err := w.ChainState(ctx, []string{"m"}, now); err != nil || st.Closed || st.Probe {
		t.Errorf("after the breaker opened: %+v %v, want held", st, err)
	}
}

func TestOutputCache(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	clock := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s.Now = func() time.Time { return clock }
	o := store.Output{Tenant: "acme", Payload: "out", Model: "m", Usage: task.Usage{PromptTokens: 1, OutputTokens: 2, TotalTokens: 3}, CostUSD: 0.01, TaskID: "t-cache"}
	if _, err := s.GetOutput(ctx, "acme", "fp1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("empty cache: %v", err)
	}
	if err := s.CreateTask(ctx, newTask("t-cache")); err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(ctx, store.Remembered{Output: o, Fingerprint: "fp1", CacheTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetOutput(ctx, "acme", "fp1")
	if err != nil || got.Payload != "out" || got.Usage.TotalTokens != 3 || got.Fingerprint != "fp1" {
		t.Fatalf("hit: %+v %v", got, err)
	}
	if _, err := s.GetOutput(ctx, "other", "fp1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another tenant read it: %v", err)
	}
	clock = clock.Add(time.Hour)
	if _, err := s.GetOutput(ctx, "acme", "fp1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("expired entry served: %v", err)
	}
}

// Batches from many instances add up in the sharded counters; a batch written again — its first
// write's outcome was unknown — counts once, and the total says which of an origin's batches it
// includes.
func TestBudgetCounters(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := s.AddSpend(ctx, quota.SpendFlush{Tenant: "acme", Day: "2026-12-02", Origin: fmt.Sprint("o", i), Seq: 1, USD: 0.25}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	retried := quota.SpendFlush{Tenant: "acme", Day: "2026-12-02", Origin: "o3", Seq: 2, USD: 1}
	for range 2 {
		if err := s.AddSpend(ctx, retried); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddSpend(ctx, quota.SpendFlush{Tenant: "acme", Day: "2026-12-03", Origin: "o3", Seq: 3, USD: 7}); err != nil {
		t.Fatal(err)
	}
	got, applied, err := s.Spent(ctx, "acme", "2026-12-02", "o3")
	if err != nil || math.Abs(got-6) > 1e-9 || applied != 2 {
		t.Fatalf("spent %v (o3's last batch %d) %v, want 6 with batch 2: the retried batch counted once", got, applied, err)
	}
	if got, _, _ := s.Spent(ctx, "other", "2026-12-02", "o3"); got != 0 {
		t.Errorf("another tenant spent %v", got)
	}
}

// TestBudgetsOverStore runs the in-memory soft limit over the sharded counters: two instances
// share the day's total through the store.
func TestBudgetsOverStore(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	now := func() time.Time { return time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC) }
	a := quota.NewBudgets(s, now, 0)
	b := quota.NewBudgets(s, now, 0)
	h, err := a.Reserve(ctx, "acme", 1.0, 0.6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, "acme", 1.0, 0.6); !errors.Is(err, quota.ErrBudgetExhausted) {
		t.Fatalf("second reservation on one instance: %v, want exhausted", err)
	}
	h.Settle(0.7)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "acme", 1.0, 0.5); !errors.Is(err, quota.ErrBudgetExhausted) {
		t.Errorf("the other instance does not see the flushed spend: %v", err)
	}
	if _, err := b.Reserve(ctx, "acme", 1.0, 0.2); err != nil {
		t.Errorf("room left: %v", err)
	}
}

// TestCacheKeyedByFingerprint: the same request of the same tenant hits; another temperature or
// another tenant misses.
func TestCacheKeyedByFingerprint(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	temp := func(v float64) *float64 { return &v }
	req := gemini.Request{Models: []string{"m"}, Prompt: "p", Config: task.GenConfig{Temperature: temp(0.3)}}
	fp := gemini.Fingerprint("acme", req, "v1")
	if err := s.CreateTask(ctx, newTask("t-fp")); err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(ctx, store.Remembered{Output: store.Output{Tenant: "acme", Payload: "out", TaskID: "t-fp"}, Fingerprint: fp}); err != nil {
		t.Fatal(err)
	}
	if o, err := s.GetOutput(ctx, "acme", gemini.Fingerprint("acme", req, "v1")); err != nil || o.Payload != "out" {
		t.Fatalf("identical request: %+v %v", o, err)
	}
	warmer := req
	warmer.Config.Temperature = temp(0.9)
	if _, err := s.GetOutput(ctx, "acme", gemini.Fingerprint("acme", warmer, "v1")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another temperature hit: %v", err)
	}
	if _, err := s.GetOutput(ctx, "other", gemini.Fingerprint("other", req, "v1")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another tenant hit: %v", err)
	}
}

func TestLastGoodOutput(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	if _, err := s.GetLastGood(ctx, "acme", "summarize", "digest", "site-a/daily"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("none yet: %v", err)
	}
	for _, p := range []string{"monday", "tuesday"} {
		if err := s.CreateTask(ctx, newTask("t-"+p)); err != nil {
			t.Fatal(err)
		}
		r := store.Remembered{Output: store.Output{Tenant: "acme", Payload: p, Model: "m", TaskID: "t-" + p},
			Family: "summarize", Variant: "digest", SubjectKey: "site-a/daily"}
		if err := s.Remember(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	o, err := s.GetLastGood(ctx, "acme", "summarize", "digest", "site-a/daily")
	if err != nil || o.Payload != "tuesday" {
		t.Fatalf("last good: %+v %v, want tuesday", o, err)
	}
	for name, args := range map[string][4]string{
		"tenant":  {"other", "summarize", "digest", "site-a/daily"},
		"subject": {"acme", "summarize", "digest", "site-b/daily"},
		"variant": {"acme", "summarize", "default", "site-a/daily"},
	} {
		if _, err := s.GetLastGood(ctx, args[0], args[1], args[2], args[3]); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("another %s read it: %v", name, err)
		}
	}
}

// An output erased while its worker was about to remember it is not written back: Remember after
// the erase writes nothing; before it, EraseOutputs removes the cache entry and the last good
// output the task wrote, and leaves a later task's last good output of the same subject.
func TestEraseWinsOverRemember(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	remembered := func(id, subject string) store.Remembered {
		return store.Remembered{Output: store.Output{Tenant: "acme", Payload: "output of " + id, Model: "m", TaskID: id},
			Fingerprint: "fp-" + id, Family: "summarize", Variant: "digest", SubjectKey: subject}
	}
	erase := func(id string) {
		t.Helper()
		if _, err := s.MutateTask(ctx, id, func(tk *protocol.Task, now time.Time) error { tk.Erase(now); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := s.EraseOutputs(ctx, id, "fp-"+id); err != nil {
			t.Fatal(err)
		}
	}
	left := func(id, subject string) []string {
		t.Helper()
		var out []string
		if _, err := s.GetOutput(ctx, "acme", "fp-"+id); err == nil {
			out = append(out, "cache entry")
		}
		if o, err := s.GetLastGood(ctx, "acme", "summarize", "digest", subject); err == nil && o.TaskID == id {
			out = append(out, "last good output")
		}
		return out
	}
	for _, id := range []string{"t-late", "t-early", "t-later"} {
		if err := s.CreateTask(ctx, newTask(id)); err != nil {
			t.Fatal(err)
		}
	}

	erase("t-late")
	if err := s.Remember(ctx, remembered("t-late", "site-late")); !errors.Is(err, store.ErrErased) {
		t.Errorf("Remember after the erase: %v, want ErrErased", err)
	}
	if got := left("t-late", "site-late"); len(got) != 0 {
		t.Errorf("written back after the erase: %v", got)
	}

	if err := s.Remember(ctx, remembered("t-early", "site-1")); err != nil {
		t.Fatal(err)
	}
	if got := left("t-early", "site-1"); len(got) != 2 {
		t.Fatalf("remembered before the erase: %v, want both entries", got)
	}
	if err := s.Remember(ctx, remembered("t-later", "site-1")); err != nil { // replaces t-early's last good output
		t.Fatal(err)
	}
	erase("t-early")
	if got := left("t-early", "site-1"); len(got) != 0 {
		t.Errorf("left after the erase: %v", got)
	}
	if got := left("t-later", "site-1"); len(got) != 2 {
		t.Errorf("another task's entries: %v, want both kept", got)
	}
}
