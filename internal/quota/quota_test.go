package quota_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/genbox-dev/genbox/internal/quota"
)

// spendStore is a hand-written SpendStore fake.
type spendStore struct {
	AddSpendFunc func(ctx context.Context, f quota.SpendFlush) error
	SpentFunc    func(ctx context.Context, tenant, day, origin string) (float64, int64, error)
}

func (s *spendStore) AddSpend(ctx context.Context, f quota.SpendFlush) error {
	return s.AddSpendFunc(ctx, f)
}

func (s *spendStore) Spent(ctx context.Context, tenant, day, origin string) (float64, int64, error) {
	return s.SpentFunc(ctx, tenant, day, origin)
}

// memTotals is the state of a SpendStore in memory: totals per tenant/day, the last batch
// counted per tenant/day/origin (as the store records it), and the reads made.
type memTotals struct {
	mu      sync.Mutex
	totals  map[string]float64
	applied map[string]int64
	reads   int
}

func (m *memTotals) add(f quota.SpendFlush) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k := f.Tenant + "/" + f.Day + "/" + f.Origin; m.applied[k] < f.Seq {
		m.applied[k] = f.Seq
		m.totals[f.Tenant+"/"+f.Day] += f.USD
	}
}

func (m *memTotals) spent(tenant, day, origin string) (float64, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	return m.totals[tenant+"/"+day], m.applied[tenant+"/"+day+"/"+origin]
}

func (m *memTotals) snapshot() (map[string]float64, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.totals), m.reads
}

// memSpend is a SpendStore in memory that counts each batch once, as the store does.
func memSpend() (*spendStore, *memTotals) {
	m := &memTotals{totals: map[string]float64{}, applied: map[string]int64{}}
	return &spendStore{
		AddSpendFunc: func(_ context.Context, f quota.SpendFlush) error { m.add(f); return nil },
		SpentFunc: func(_ context.Context, tenant, day, origin string) (float64, int64, error) {
			total, applied := m.spent(tenant, day, origin)
			return total, applied, nil
		},
	}, m
}

func TestBudgetsSoftLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, mem := memSpend()
	now := time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC)
	b := quota.NewBudgets(store, func() time.Time { return now }, time.Minute)

	h1, err := b.Reserve(ctx, "acme", 1, 0.4)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := b.Reserve(ctx, "acme", 1, 0.4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "acme", 1, 0.4); !errors.Is(err, quota.ErrBudgetExhausted) {
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
	if _, reads := mem.snapshot(); reads != 2 {
		t.Errorf("%d store reads, want one per tenant within the refresh interval", reads)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if totals, _ := mem.snapshot(); totals["acme/2026-12-02"] < 0.3-1e-9 || totals["acme/2026-12-02"] > 0.3+1e-9 {
		t.Errorf("flushed %v, want 0.3 for acme", totals)
	}
	if got := quota.ResetAt(now); !got.Equal(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)) {
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
	if totals, _ := mem.snapshot(); totals["free/2026-12-02"] != 2 {
		t.Errorf("unlimited tenant's spend not counted: %v", totals)
	}
}

func TestBudgetsFlushFailureIsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, mem := memSpend()
	fail := true
	add := store.AddSpendFunc
	store.AddSpendFunc = func(ctx context.Context, f quota.SpendFlush) error {
		if fail {
			return errors.New("unavailable")
		}
		return add(ctx, f)
	}
	b := quota.NewBudgets(store, time.Now, time.Minute)
	h, err := b.Reserve(ctx, "acme", 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	h.Settle(0.5)
	if err := b.Flush(ctx); err == nil {
		t.Fatal("flush error swallowed")
	}
	fail = false
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if totals, _ := mem.snapshot(); totals["acme/"+quota.Day(time.Now())] != 0.5 {
		t.Errorf("retried flush wrote %v, want 0.5", totals)
	}
	if _, err := b.Reserve(ctx, "acme", 10, 9.6); !errors.Is(err, quota.ErrBudgetExhausted) {
		t.Errorf("flushed spend forgotten: %v", err)
	}
}

// A flush whose write landed but whose answer was lost (an unknown outcome) is retried and
// counted once, in the store and in the instance's own total: before, the retry added it again.
func TestBudgetsUnknownFlushOutcomeCountsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, mem := memSpend()
	lost := true
	add := store.AddSpendFunc
	store.AddSpendFunc = func(ctx context.Context, f quota.SpendFlush) error {
		err := add(ctx, f)
		if lost {
			lost = false
			return errors.New("deadline exceeded") // applied, but the answer never came
		}
		return err
	}
	b := quota.NewBudgets(store, time.Now, time.Hour)
	h, err := b.Reserve(ctx, "acme", 1, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	h.Settle(0.5)
	if err := b.Flush(ctx); err == nil {
		t.Fatal("flush error swallowed")
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if totals, _ := mem.snapshot(); totals["acme/"+quota.Day(time.Now())] != 0.5 {
		t.Errorf("store total %v after the retry, want 0.5 counted once", totals)
	}
	if _, err := b.Reserve(ctx, "acme", 1, 0.4); err != nil {
		t.Errorf("$0.4 more within a $1 budget of which $0.5 is spent: %v", err)
	}
}

// A reservation that reads the store while a flush is in flight counts the flushed spend once:
// neither missed while it is being written (under-count) nor twice once the write is read back
// (double count).
func TestBudgetsReserveRacingFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := memSpend()
	add := store.AddSpendFunc
	entered, applied, landed, release := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	store.AddSpendFunc = func(ctx context.Context, f quota.SpendFlush) error {
		entered <- struct{}{}
		<-applied
		err := add(ctx, f)
		close(landed)
		<-release
		return err
	}
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	later := func() { mu.Lock(); now = now.Add(time.Minute); mu.Unlock() } // past the refresh: the next Reserve reads
	b := quota.NewBudgets(store, clock, time.Minute)
	h, err := b.Reserve(ctx, "acme", 1, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	h.Settle(0.5)
	flushed := make(chan error, 1)
	go func() { flushed <- b.Flush(ctx) }()
	<-entered
	later()
	if h, err := b.Reserve(ctx, "acme", 1, 0.6); !errors.Is(err, quota.ErrBudgetExhausted) {
		t.Errorf("while $0.5 is being flushed, $0.6 more of $1 was granted: %v", err)
		if err == nil {
			h.Settle(0)
		}
	}
	close(applied)
	<-landed
	later() // this read sees the batch in the store, before the flush hears so
	if h, err := b.Reserve(ctx, "acme", 1, 0.4); err != nil {
		t.Errorf("$0.4 more of $1 with $0.5 spent, read while the flush lands: %v", err)
	} else {
		h.Settle(0)
	}
	close(release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if h, err := b.Reserve(ctx, "acme", 1, 0.4); err != nil { // no read: the instance's own total
		t.Errorf("$0.4 more of $1 with $0.5 spent, after the flush: %v", err)
	} else {
		h.Settle(0)
	}
}

func TestParseBudgetPolicy(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]quota.BudgetPolicy{"": quota.BudgetWait, "wait": quota.BudgetWait, "fail": quota.BudgetFail, "drop": ""} {
		got, err := quota.ParseBudgetPolicy(in)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("ParseBudgetPolicy(%q) = %q, %v", in, got, err)
		}
	}
}

// A project limit caps every tenant together, each within its own budget; it is counted once
// per dollar in the project's counter (Record included), and a project total that cannot be
// read reserves nothing: the call does not start.
func TestBudgetsProjectLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, mem := memSpend()
	spent := store.SpentFunc
	unreadable := false
	store.SpentFunc = func(ctx context.Context, tenant, day, origin string) (float64, int64, error) {
		if unreadable && tenant == quota.ProjectCounter {
			return 0, 0, errors.New("unavailable")
		}
		return spent(ctx, tenant, day, origin)
	}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	b := quota.NewBudgets(store, func() time.Time { return now }, time.Minute, quota.WithProjectLimit(1))
	day := quota.Day(now)

	a, err := b.Reserve(ctx, "acme", 10, 0.6)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Reserve(ctx, "other", 10, 0.6)
	if !errors.Is(err, quota.ErrProjectBudgetExhausted) || errors.Is(err, quota.ErrBudgetExhausted) {
		t.Fatalf("a second tenant past the project's $1: %v, want the project's budget exhausted (not the tenant's)", err)
	}
	a.Settle(0.5)
	b.Record("other", 0.25)
	o, err := b.Reserve(ctx, "other", 0, 0.2) // a tenant without a limit is still held to the project's
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "acme", 10, 0.1); !errors.Is(err, quota.ErrProjectBudgetExhausted) {
		t.Fatalf("$0.1 more with $0.95 spent or held of the project's $1: %v, want exhausted", err)
	}
	o.Settle(0.2)
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	totals, _ := mem.snapshot()
	want := map[string]float64{"acme/" + day: 0.5, "other/" + day: 0.45, quota.ProjectCounter + "/" + day: 0.95}
	if diff := cmp.Diff(want, totals, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("flushed totals (-want +got):\n%s", diff)
	}

	// Another instance must read the project's total; while it cannot, it reserves nothing.
	unreadable = true
	c := quota.NewBudgets(store, func() time.Time { return now }, time.Minute, quota.WithProjectLimit(1))
	if _, err := c.Reserve(ctx, "acme", 10, 0.01); err == nil || errors.Is(err, quota.ErrProjectBudgetExhausted) {
		t.Fatalf("project total unreadable: %v, want the read's error", err)
	}
	unreadable = false
	if _, err := c.Reserve(ctx, "acme", 10, 0.04); err != nil {
		t.Errorf("$0.04 of the $0.05 left, once readable: %v (the failed attempt must hold nothing)", err)
	}
}

// Reserves that find a total stale together read it once: the first reads, the others wait for
// its answer (64 calls starting at once used to read the tenant's and the project's counters 64
// times each).
func TestBudgetsReadAStaleTotalOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, mem := memSpend()
	release := make(chan struct{})
	firstRead := make(chan struct{}, 1)
	store := &spendStore{
		AddSpendFunc: func(context.Context, quota.SpendFlush) error { return nil },
		SpentFunc: func(_ context.Context, tenant, day, origin string) (float64, int64, error) {
			select {
			case firstRead <- struct{}{}:
			default:
			}
			<-release
			total, applied := mem.spent(tenant, day, origin)
			return total, applied, nil
		},
	}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	b := quota.NewBudgets(store, func() time.Time { return now }, time.Minute, quota.WithProjectLimit(100))
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	reserve := func() {
		_, err := b.Reserve(ctx, "acme", 10, 0.01)
		errs <- err
	}
	wg.Go(reserve) // the first reserve reads the tenant's counter and holds the read open
	<-firstRead
	for range n - 1 {
		wg.Go(reserve)
	}
	time.Sleep(50 * time.Millisecond) // let the others find the read under way
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, got := mem.snapshot(); got != 2 {
		t.Errorf("%d reads for %d reserves of a stale total, want 2 (the tenant's and the project's, once each)", got, n)
	}
}

// A re-read of a total read before holds no other reserve: they are served the total as it was,
// so a refresh never stalls every call at once. Once the total has gone unread for two refresh
// intervals, they wait for the read again and fail closed with its error.
func TestBudgetsReReadHoldsNoReserve(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		_, mem := memSpend()
		var release chan struct{} // while set, a read waits for it
		var readErr error
		store := &spendStore{
			AddSpendFunc: func(context.Context, quota.SpendFlush) error { return nil },
			SpentFunc: func(_ context.Context, tenant, day, origin string) (float64, int64, error) {
				if release != nil {
					<-release
				}
				if readErr != nil {
					return 0, 0, readErr
				}
				total, applied := mem.spent(tenant, day, origin)
				return total, applied, nil
			},
		}
		b := quota.NewBudgets(store, time.Now, time.Minute)
		reserve := func() <-chan error {
			done := make(chan error, 1)
			go func() {
				_, err := b.Reserve(ctx, "acme", 10, 0.01)
				done <- err
			}()
			return done
		}
		if err := <-reserve(); err != nil { // the first read
			t.Fatal(err)
		}

		time.Sleep(90 * time.Second) // stale, within two refreshes
		release = make(chan struct{})
		rereader := reserve()
		synctest.Wait()
		others := make([]<-chan error, 8)
		for i := range others {
			others[i] = reserve()
		}
		synctest.Wait()
		for i, done := range others {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("reserve %d during the re-read: %v", i, err)
				}
			default:
				t.Errorf("reserve %d waited for the re-read of a total read 90 s ago (refresh 1 min)", i)
			}
		}
		close(release)
		if err := <-rereader; err != nil {
			t.Fatal(err)
		}

		time.Sleep(3 * time.Minute) // unread for more than two refreshes, and the store failing
		release, readErr = make(chan struct{}), errors.New("firestore unavailable")
		rereader = reserve()
		synctest.Wait()
		waiter := reserve()
		synctest.Wait()
		select {
		case err := <-waiter:
			t.Fatalf("a reserve of a total unread for two refreshes did not wait for the read (err %v)", err)
		default:
		}
		close(release)
		for _, done := range []<-chan error{rereader, waiter} {
			if err := <-done; !errors.Is(err, readErr) {
				t.Errorf("reserve of a total unreadable for two refreshes: %v, want the read's error", err)
			}
		}
	})
}

// A kept hold is spend every instance reads, on the day it was reserved; its settlement, a day
// later and in another instance, puts the actual cost in its place on that day.
func TestBudgetsKeptHoldSettledLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, mem := memSpend()
	now := time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a := quota.NewBudgets(store, clock, time.Minute, quota.WithProjectLimit(10))
	h, err := a.Reserve(ctx, "acme", 1, 0.6)
	if err != nil {
		t.Fatal(err)
	}
	c := h.Charge()
	h.Keep()
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	other := quota.NewBudgets(store, clock, time.Minute, quota.WithProjectLimit(10))
	if _, err := other.Reserve(ctx, "acme", 1, 0.5); !errors.Is(err, quota.ErrBudgetExhausted) {
		t.Fatalf("another instance reserving $0.5 with $0.6 kept of $1: %v, want exhausted", err)
	}
	now = now.Add(2 * time.Hour)
	other.SettleCharge(c, 0.1)
	if err := other.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	day := quota.Day(now.Add(-2 * time.Hour))
	totals, _ := mem.snapshot()
	want := map[string]float64{"acme/" + day: 0.1, quota.ProjectCounter + "/" + day: 0.1}
	if diff := cmp.Diff(want, totals, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("flushed totals (-want +got):\n%s", diff)
	}
}
