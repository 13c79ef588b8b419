package store_test

import (
	"context"
	"errors"
	"fmt"
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
	o := &store.Output{Fingerprint: "fp1", Tenant: "acme", Payload: "out", Model: "m", Usage: task.Usage{PromptTokens: 1, OutputTokens: 2, TotalTokens: 3}, CostUSD: 0.01}
	if _, err := s.GetOutput(ctx, "acme", "fp1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("empty cache: %v", err)
	}
	if err := s.PutOutput(ctx, o, time.Hour); err != nil {
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
			if err := s.AddSpend(ctx, gemini.SpendFlush{Tenant: "acme", Day: "2026-12-02", Origin: fmt.Sprint("o", i), Seq: 1, USD: 0.25}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	retried := gemini.SpendFlush{Tenant: "acme", Day: "2026-12-02", Origin: "o3", Seq: 2, USD: 1}
	for range 2 {
		if err := s.AddSpend(ctx, retried); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddSpend(ctx, gemini.SpendFlush{Tenant: "acme", Day: "2026-12-03", Origin: "o3", Seq: 3, USD: 7}); err != nil {
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
	if err := s.PutOutput(ctx, &store.Output{Fingerprint: fp, Tenant: "acme", Payload: "out"}, 0); err != nil {
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
		if err := s.PutLastGood(ctx, "summarize", "digest", "site-a/daily", &store.Output{Tenant: "acme", Payload: p, Model: "m"}, 0); err != nil {
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
