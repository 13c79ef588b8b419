package gemini_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/pkg/gemini"
)

// spendStore is a hand-written SpendStore fake.
type spendStore struct {
	AddSpendFunc func(ctx context.Context, tenant, day string, usd float64) error
	SpentFunc    func(ctx context.Context, tenant, day string) (float64, error)
}

func (s *spendStore) AddSpend(ctx context.Context, tenant, day string, usd float64) error {
	return s.AddSpendFunc(ctx, tenant, day, usd)
}

func (s *spendStore) Spent(ctx context.Context, tenant, day string) (float64, error) {
	return s.SpentFunc(ctx, tenant, day)
}

// memSpend is a SpendStore in memory that counts reads.
func memSpend() (*spendStore, func() (map[string]float64, int)) {
	var mu sync.Mutex
	totals := map[string]float64{}
	reads := 0
	return &spendStore{
			AddSpendFunc: func(_ context.Context, tenant, day string, usd float64) error {
				mu.Lock()
				defer mu.Unlock()
				totals[tenant+"/"+day] += usd
				return nil
			},
			SpentFunc: func(_ context.Context, tenant, day string) (float64, error) {
				mu.Lock()
				defer mu.Unlock()
				reads++
				return totals[tenant+"/"+day], nil
			},
		}, func() (map[string]float64, int) {
			mu.Lock()
			defer mu.Unlock()
			out := map[string]float64{}
			for k, v := range totals {
				out[k] = v
			}
			return out, reads
		}
}

func TestBudgetsSoftLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, snapshot := memSpend()
	now := time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC)
	b := gemini.NewBudgets(store, func() time.Time { return now }, time.Minute)

	h1, err := b.Reserve(ctx, "acme", 1, 0.4)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := b.Reserve(ctx, "acme", 1, 0.4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "acme", 1, 0.4); !errors.Is(err, gemini.ErrBudgetExhausted) {
		t.Fatalf("third reservation: %v, want exhausted", err)
	}
	if _, err := b.Reserve(ctx, "other", 1, 0.4); err != nil {
		t.Errorf("another tenant is limited by acme's spend: %v", err)
	}
	h1.Settle(0.1) // cost less than estimated: room comes back
	h1.Settle(5)   // a second Settle does nothing
	if _, err := b.Reserve(ctx, "acme", 1, 0.4); err != nil {
		t.Errorf("after settling below the estimate: %v", err)
	}
	h2.Settle(0.2)
	if _, reads := snapshot(); reads != 2 {
		t.Errorf("%d store reads, want one per tenant within the refresh interval", reads)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if totals, _ := snapshot(); totals["acme/2026-12-02"] < 0.3-1e-9 || totals["acme/2026-12-02"] > 0.3+1e-9 {
		t.Errorf("flushed %v, want 0.3 for acme", totals)
	}
	if got := gemini.ResetAt(now); !got.Equal(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("ResetAt = %s", got)
	}
	// No limit: always room, spend still counted.
	h, err := b.Reserve(ctx, "free", 0, 1e9)
	if err != nil {
		t.Fatal(err)
	}
	h.Settle(2)
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if totals, _ := snapshot(); totals["free/2026-12-02"] != 2 {
		t.Errorf("unlimited tenant's spend not counted: %v", totals)
	}
}

func TestBudgetsFlushFailureIsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fail := true
	var got float64
	store := &spendStore{
		AddSpendFunc: func(_ context.Context, _, _ string, usd float64) error {
			if fail {
				return errors.New("unavailable")
			}
			got += usd
			return nil
		},
		SpentFunc: func(context.Context, string, string) (float64, error) { return 0, nil },
	}
	b := gemini.NewBudgets(store, time.Now, time.Minute)
	h, err := b.Reserve(ctx, "acme", 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	h.Settle(0.5)
	if err := b.Flush(ctx); err == nil {
		t.Fatal("flush error swallowed")
	}
	fail = false
	if err := b.Flush(ctx); err != nil || got != 0.5 {
		t.Errorf("retried flush: %v, wrote %v, want 0.5", err, got)
	}
	if _, err := b.Reserve(ctx, "acme", 10, 9.6); !errors.Is(err, gemini.ErrBudgetExhausted) {
		t.Errorf("flushed spend forgotten: %v", err)
	}
}

func TestSlots(t *testing.T) {
	t.Parallel()
	s := gemini.NewSlots(100 * time.Millisecond)
	for i := range 2 {
		if ok, _ := s.Acquire("acme", 2); !ok {
			t.Fatalf("slot %d refused", i)
		}
	}
	ok, after := s.Acquire("acme", 2)
	if ok || after < 100*time.Millisecond || after > 200*time.Millisecond {
		t.Fatalf("over the cap: %v, retry after %s; want refused with 100-200ms", ok, after)
	}
	if ok, _ := s.Acquire("other", 2); !ok {
		t.Error("another tenant starved by acme")
	}
	s.Release("acme")
	if ok, _ := s.Acquire("acme", 2); !ok {
		t.Error("released slot not reusable")
	}
	if ok, _ := s.Acquire("nolimit", 0); !ok {
		t.Error("no cap refused")
	}
	if n := s.InUse("acme"); n != 2 {
		t.Errorf("in use %d, want 2", n)
	}
}

func TestParseBudgetPolicy(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]gemini.BudgetPolicy{"": gemini.BudgetWait, "wait": gemini.BudgetWait, "fail": gemini.BudgetFail, "drop": ""} {
		got, err := gemini.ParseBudgetPolicy(in)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("ParseBudgetPolicy(%q) = %q, %v", in, got, err)
		}
	}
}
