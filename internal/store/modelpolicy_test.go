package store_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

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
	if ok, err := s.ChainAvailable(ctx, chain, now); err != nil || !ok {
		t.Fatalf("fresh chain: %v %v, want available", ok, err)
	}
	for _, m := range chain {
		if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: m, From: gemini.BreakerClosed, To: gemini.BreakerOpen, At: now, RetryAt: now.Add(time.Minute), Reason: "5 consecutive failures"}); err != nil {
			t.Fatal(err)
		}
	}
	bs, err := s.Breakers(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	if b := bs["models/m-b"]; b.State != "open" || b.RetryAt == nil || !b.RetryAt.Equal(now.Add(time.Minute)) {
		t.Errorf("breaker doc %+v", b)
	}
	if ok, _ := s.ChainAvailable(ctx, chain, now.Add(30*time.Second)); ok {
		t.Error("every model open, yet available")
	}
	if ok, _ := s.ChainAvailable(ctx, chain, now.Add(time.Minute)); !ok {
		t.Error("past the retry time, not available")
	}
	if err := s.SaveBreaker(ctx, gemini.BreakerChange{Model: "m-a", From: gemini.BreakerHalfOpen, To: gemini.BreakerClosed, At: now}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.ChainAvailable(ctx, chain, now.Add(time.Second)); !ok {
		t.Error("one model closed, yet not available")
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

func TestBudgetCounters(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if err := s.AddSpend(ctx, "acme", "2026-12-02", 0.25); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.AddSpend(ctx, "acme", "2026-12-03", 7); err != nil {
		t.Fatal(err)
	}
	got, err := s.Spent(ctx, "acme", "2026-12-02")
	if err != nil || math.Abs(got-5) > 1e-9 {
		t.Fatalf("spent %v %v, want 5", got, err)
	}
	if got, _ := s.Spent(ctx, "other", "2026-12-02"); got != 0 {
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
	a := gemini.NewBudgets(s, now, 0)
	b := gemini.NewBudgets(s, now, 0)
	h, err := a.Reserve(ctx, "acme", 1.0, 0.6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, "acme", 1.0, 0.6); !errors.Is(err, gemini.ErrBudgetExhausted) {
		t.Fatalf("second reservation on one instance: %v, want exhausted", err)
	}
	h.Settle(0.7)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "acme", 1.0, 0.5); !errors.Is(err, gemini.ErrBudgetExhausted) {
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
		if _, err := s.MutateTask(ctx, id, func(tk *store.Task, now time.Time) error { tk.Erase(now); return nil }); err != nil {
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
