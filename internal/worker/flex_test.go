package worker

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/genbox-dev/genbox/internal/protocol"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// flexPricing is the price of the tests' model "m": flex at half the standard price.
var flexPricing = gemini.Pricing{Prices: map[string]gemini.Price{"m": {InputPerM: 1, OutputPerM: 2, FlexInputPerM: 0.5, FlexOutputPerM: 1}}}

func flexPolicy(owner string) Policy {
	p := policy(owner)
	p.FlexMargin = 15 * time.Minute
	return p
}

func flexTask(runBefore time.Duration) func(*protocol.Task) {
	return func(t *protocol.Task) {
		t.Mode = task.ModeFlex
		if runBefore > 0 {
			rb := time.Now().Add(runBefore)
			t.RunBefore = &rb
		}
	}
}

func TestFlexTaskIsServedAtTheFlexPrice(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": "m=1/2"})
	b.task(t, "flex", flexTask(0))
	b.handler(flexPolicy("w1"), chain("m")).Handle(context.Background(), msg("flex"))
	got := b.get(t, "flex")
	bills := b.srv.Ledger().BillsFor("flex")
	if got.State != task.StateSucceeded || len(bills) != 1 || bills[0].Tier != geminitest.TierFlex {
		t.Fatalf("task %s, bills %+v: want succeeded after one flex call", got.State, bills)
	}
	if want := bills[0].CostUSD(flexPricing); want == 0 || math.Abs(got.CostUSD-want) > 1e-15 {
		t.Errorf("cost_usd %g, the invoice %g", got.CostUSD, want)
	}
	if v := got.View(); v.Mode != task.ModeFlex {
		t.Errorf("the API shows mode %q", v.Mode)
	}
}

// A shed flex call is not a model failure: the task waits its backoff with no attempt spent,
// and the breaker stays closed however often it happens.
func TestFlexShedIsRetriedWithoutAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.srv.SetShedding("m", geminitest.Shedding{Fraction: 1})
	h := b.handler(flexPolicy("w1"), chain("m"))
	for i := range 8 {
		id := "shed-" + string(rune('a'+i))
		b.task(t, id, flexTask(time.Hour))
		h.Handle(context.Background(), msg(id))
		got := b.get(t, id)
		if got.State != task.StateQueued || got.Attempts != 0 || got.Sheds != 1 || got.NotBefore == nil || got.Lease.Owner != "" {
			t.Fatalf("after a shed: state %s attempts %d sheds %d not_before %v lease %+v; want queued, no attempt, one shed, a backoff",
				got.State, got.Attempts, got.Sheds, got.NotBefore, got.Lease)
		}
		if d := time.Until(*got.NotBefore); d > time.Second {
			t.Errorf("first shed backoff %s, want at most the retry base", d)
		}
	}
	if !b.gen.Available([]string{"m"}) {
		t.Error("eight sheds opened the breaker")
	}
	if l := b.srv.Ledger(); l.Total.Shed != 8 || l.Total.Generations != 0 {
		t.Errorf("ledger %+v, want 8 shed calls and nothing billed", l.Total)
	}
	if shed, released := b.count(t, h, obs.MetricRetries, obs.AttrClass+"=shed"), b.outcomes(t, h, obs.WorkerReleased); shed != 8 || released != 0 {
		t.Errorf("%d sheds, %d released attempts; want 8 sheds and no released attempt", shed, released)
	}
}

func TestFlexMovesToTheStandardTierNearRunBefore(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	h := b.handler(flexPolicy("w1"), chain("m"))
	// Inside the margin: the standard tier at once.
	b.task(t, "near", flexTask(10*time.Minute))
	h.Handle(context.Background(), msg("near"))
	if bills := b.srv.Ledger().BillsFor("near"); len(bills) != 1 || bills[0].Tier != geminitest.TierStandard {
		t.Errorf("a flex task 10 min from run_before: bills %+v, want one standard call", bills)
	}
	// Just outside it: flex first; shed, and a retry after the backoff would come inside the
	// margin, so the same attempt goes on at once on the standard tier.
	b.srv.SetShedding("m", geminitest.Shedding{Fraction: 1})
	b.task(t, "edge", flexTask(15*time.Minute+500*time.Millisecond))
	h.Handle(context.Background(), msg("edge"))
	got := b.get(t, "edge")
	bills := b.srv.Ledger().BillsFor("edge")
	if got.State != task.StateSucceeded || got.Attempts != 0 || len(bills) != 1 || bills[0].Tier != geminitest.TierStandard || got.ModelCalls != 2 {
		t.Errorf("state %s attempts %d calls %d bills %+v: want succeeded on the standard tier after one shed flex call", got.State, got.Attempts, got.ModelCalls, bills)
	}
}

// A priority task is called on the Priority tier, and records and is charged for the tier that
// served it: the Priority tier's price, or the standard price when Gemini served it there.
func TestPriorityTaskRecordsTheTierServed(t *testing.T) {
	t.Parallel()
	b := setupWith(t, 0, map[string]string{"GENBOX_PRICES": "m=1/2;priority=1.8/3.6"})
	pricing := gemini.Pricing{Prices: map[string]gemini.Price{"m": {InputPerM: 1, OutputPerM: 2, PriorityInputPerM: 1.8, PriorityOutputPerM: 3.6}}}
	h := b.handler(policy("w1"), chain("m"))
	priority := func(d *protocol.Task) { d.Mode = task.ModePriority }
	for _, c := range []struct {
		id       string
		fallback float64
		tier     string
	}{{"served", 0, geminitest.TierPriority}, {"downgraded", 1, geminitest.TierStandard}} {
		b.srv.SetPriorityFallback("m", c.fallback)
		b.task(t, c.id, priority)
		h.Handle(context.Background(), msg(c.id))
		got := b.get(t, c.id)
		bills := b.srv.Ledger().BillsFor(c.id)
		if got.State != task.StateSucceeded || len(bills) != 1 || bills[0].Request.Tier != c.tier {
			t.Fatalf("%s: task %s, bills %+v: want succeeded after one call served on %s", c.id, got.State, bills, c.tier)
		}
		if v := got.View(); got.Tier != c.tier || v.Tier != c.tier || v.Mode != task.ModePriority {
			t.Errorf("%s: tier %q (the API shows %q, mode %q), want %q", c.id, got.Tier, v.Tier, v.Mode, c.tier)
		}
		if want := bills[0].CostUSD(pricing); want == 0 || math.Abs(got.CostUSD-want) > 1e-15 {
			t.Errorf("%s: cost_usd %g, the invoice %g", c.id, got.CostUSD, want)
		}
	}
}
