package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/quota"
	"github.com/genbox-dev/genbox/internal/store"
)

// Two backlogged tenants of weights 3 and 1, each capped above the pool, share one instance's
// 8 slots: while both are backlogged (both held to their shares), the slots they hold, sampled
// from their counts, are 3:1 within 10 %; once the heavy one's backlog ends, the light one takes
// every slot; every task succeeds and both counts end at zero.
func TestFairSharesByWeight(t *testing.T) {
	t.Parallel()
	// Calls long beside the emulator's commits under the package's load, so that a slot's
	// hand-off takes a small part of its time.
	b := setup(t, 2*time.Second)
	const pool = 8
	b.tenant(t, "heavy", store.Limits{Concurrency: 100, Weight: 3})
	b.tenant(t, "light", store.Limits{Concurrency: 100, Weight: 1})
	pol := policy("w1")
	pol.LeaseTTL, pol.CommitRetry = time.Minute, time.Minute // the emulator under the package's load
	h := b.handler(pol, chain("m"), WithModelPolicy(b.modelPolicy(quota.BudgetWait)), WithCapacity(pool, pool/2, 4*pool),
		WithTenantSlots(time.Hour), WithFairShares(1))
	consume(t, h)
	ctx, stop := context.WithCancel(context.Background())
	divided := make(chan struct{})
	go func() { defer close(divided); h.RunFairShares(ctx) }()
	t.Cleanup(func() { stop(); <-divided })

	const heavyN, lightN = 60, 60
	var ids []string
	for i := range lightN {
		for _, tn := range []struct {
			name string
			n    int
		}{{"heavy", heavyN}, {"light", lightN}} {
			if i < tn.n {
				id := fmt.Sprintf("%s-%03d", tn.name, i)
				b.capTask(t, tn.name, id, func(d *protocol.Task) { d.AwaitSlot(time.Now().Add(time.Hour)) })
				ids = append(ids, id)
			}
		}
	}
	// The tasks are created waiting, as the publisher creates a backlog's (store.SlotHints), and
	// their nudges arrive as a pull delivers them: a few more at once than the instance claims.
	nudges := make(chan string)
	var wg sync.WaitGroup
	for range 2 * pool {
		wg.Go(func() {
			for id := range nudges {
				tenant, _, _ := strings.Cut(id, "-")
				h.Handle(context.Background(), tenantMsg(id, tenant))
			}
		})
	}
	go func() {
		defer close(nudges)
		for _, id := range ids {
			nudges <- id
		}
	}()

	// Sample both counts while the last division holds both tenants to their shares (both ask
	// more than them: the heavy one's backlog has not ended), once the light one, admitted
	// freely before the first division, is down to its share.
	var heavy, light, samples int
	var held bool // both tenants were held to their shares
	counts := func() (int, int) {
		h, err1 := b.store.GetSlotCount(context.Background(), "heavy")
		l, err2 := b.store.GetSlotCount(context.Background(), "light")
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		return h.Running, l.Running
	}
	waitFor(t, "the heavy tenant's backlog to end", 3*time.Minute, func() bool {
		h.shares.mu.Lock()
		limited := h.shares.allot["heavy"].Limited && h.shares.allot["light"].Limited
		share := h.shares.allot["light"].Slots
		h.shares.mu.Unlock()
		held = held || limited
		if !limited {
			return held
		}
		if hc, lc := counts(); samples > 0 || lc <= share {
			heavy, light, samples = heavy+hc, light+lc, samples+1
		}
		return false
	})
	if samples < 10 {
		t.Fatalf("the shares were held for %d samples before the heavy tenant's backlog ended, want 10 at least", samples)
	}
	t.Logf("slots held while both were backlogged, over %d samples: heavy %.1f, light %.1f", samples, float64(heavy)/float64(samples), float64(light)/float64(samples))
	if heavy*10 < light*27 || heavy*10 > light*33 {
		t.Errorf("slots held while both were backlogged: heavy %d, light %d (%.2f:1), want 3:1 within 10 %%", heavy, light, float64(heavy)/float64(max(light, 1)))
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		hc, lc := counts()
		if lc == pool {
			break
		}
		if time.Now().After(deadline) {
			waiting, err := b.store.CountAwaitingSlot(context.Background(), "light")
			h.shares.mu.Lock()
			t.Fatalf("the light tenant holds %d slots (%d tasks waiting, %v), the heavy one %d, a minute after the heavy one's backlog ended; want every slot, %d (last division %+v)",
				lc, waiting, err, hc, pool, h.shares.allot)
		}
	}
	wg.Wait()
	b.waitSucceeded(t, ids...)
	if hc, lc := counts(); hc != 0 || lc != 0 {
		t.Errorf("the slot counts end at heavy %d, light %d, want 0", hc, lc)
	}
}
