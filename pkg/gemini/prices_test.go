package gemini_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

func TestParsePricesTiers(t *testing.T) {
	t.Parallel()
	got, err := gemini.ParsePrices("m=1/2, n=1/2;flex=0.6/1.2;batch=0.4/0.8;priority=1.5/3;cached=0.05;storage=2;audio=3, gemini-2.5-pro=1/8")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]gemini.Price{
		"m": {InputPerM: 1, OutputPerM: 2, FlexInputPerM: 0.5, FlexOutputPerM: 1, BatchInputPerM: 0.5, BatchOutputPerM: 1, CachedInputPerM: 0.1,
			AudioInputPerM: 1, FlexAudioInputPerM: 0.5, BatchAudioInputPerM: 0.5},
		"n": {InputPerM: 1, OutputPerM: 2, FlexInputPerM: 0.6, FlexOutputPerM: 1.2, BatchInputPerM: 0.4, BatchOutputPerM: 0.8, PriorityInputPerM: 1.5, PriorityOutputPerM: 3, CachedInputPerM: 0.05, StoragePerMHour: 2,
			AudioInputPerM: 3, FlexAudioInputPerM: 1.5, BatchAudioInputPerM: 1.5},
		"gemini-2.5-pro": {InputPerM: 1, OutputPerM: 8, FlexInputPerM: 0.5, FlexOutputPerM: 4, BatchInputPerM: 0.5, BatchOutputPerM: 4,
			CachedInputPerM: 0.1, StoragePerMHour: 4.5, AudioInputPerM: 1, FlexAudioInputPerM: 0.5, BatchAudioInputPerM: 0.5},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePrices (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"m=1/2;bogus=1", "m=1/2;cached=-1", "m=1/2;batch=1", "m=1/2;storage", "m=1/2;flex=Inf/1"} {
		if _, err := gemini.ParsePrices(bad); err == nil {
			t.Errorf("ParsePrices(%q) accepted it", bad)
		}
	}
}

func TestBillPricesTheTierAndCachedTokens(t *testing.T) {
	t.Parallel()
	p := gemini.DefaultPrices["gemini-2.5-flash"]
	u := task.Usage{PromptTokens: 11_000, CachedTokens: 9_000, OutputTokens: 3_500}
	for tier, want := range map[gemini.Tier]float64{
		gemini.TierStandard: (2_000*0.30 + 9_000*0.03 + 3_500*2.50) / 1e6,
		gemini.TierFlex:     (2_000*0.15 + 9_000*0.03 + 3_500*1.25) / 1e6,
		gemini.TierBatch:    (2_000*0.15 + 9_000*0.03 + 3_500*1.25) / 1e6,
		gemini.TierPriority: (2_000*0.30*gemini.PriorityMarkup + 9_000*0.03 + 3_500*2.50*gemini.PriorityMarkup) / 1e6,
	} {
		if got := p.Bill(u, tier); math.Abs(got-want) > 1e-15 {
			t.Errorf("%s: Bill = %g, want %g", tier, got, want)
		}
	}
	audio := task.Usage{PromptTokens: 11_000, AudioTokens: 8_000, OutputTokens: 100}
	for tier, want := range map[gemini.Tier]float64{
		gemini.TierStandard: (3_000*0.30 + 8_000*1.00 + 100*2.50) / 1e6,
		gemini.TierBatch:    (3_000*0.15 + 8_000*0.50 + 100*1.25) / 1e6,
	} {
		if got := p.Bill(audio, tier); math.Abs(got-want) > 1e-15 {
			t.Errorf("%s: Bill of audio = %g, want %g", tier, got, want)
		}
	}
	if got, want := p.Storage(9_000, 2), 9_000*2*1.00/1e6; math.Abs(got-want) > 1e-15 {
		t.Errorf("Storage = %g, want %g", got, want)
	}
}

// The cost of a call is the tier that served it (trafficType) and its cached tokens at the
// cached rate, exactly what the fake's invoice bills.
func TestCostIsTheServedTierWithCachedTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.srv.SetImplicitCaching(primary, geminitest.ImplicitCaching{MinTokens: 100, HitRate: 1})
	req := request("c")
	req.SystemInstruction = strings.Repeat("Cite every source you use. ", 100)
	ctx := context.Background()
	var results []gemini.Result
	for _, tier := range []gemini.Tier{gemini.TierStandard, gemini.TierFlex} {
		req.Tier = tier
		res, err := b.client.Generate(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	pricing := testConfig(t, b.srv).Pricing
	l := b.srv.Ledger()
	for i, res := range results {
		bill := l.Bills[i]
		if res.Usage != bill.Usage || string(res.Tier) != bill.Tier {
			t.Errorf("call %d: usage %+v on %s, the fake billed %+v on %s", i, res.Usage, res.Tier, bill.Usage, bill.Tier)
		}
		if want := bill.CostUSD(pricing); math.Abs(res.CostUSD-want) > 1e-15 || want == 0 {
			t.Errorf("call %d: cost %g, the invoice %g", i, res.CostUSD, want)
		}
	}
	if results[0].Tier != gemini.TierStandard || results[1].Tier != gemini.TierFlex || results[0].Usage.CachedTokens != 0 || results[1].Usage.CachedTokens == 0 {
		t.Errorf("tiers %s %s, cached tokens %d %d: want standard then flex, a miss then an implicit cache hit",
			results[0].Tier, results[1].Tier, results[0].Usage.CachedTokens, results[1].Usage.CachedTokens)
	}
	uncached := results[1].Usage
	uncached.CachedTokens = 0
	if full := pricing.Price(primary).Bill(uncached, gemini.TierFlex); results[1].CostUSD >= full {
		t.Errorf("a cache hit cost %g, the same tokens uncached %g", results[1].CostUSD, full)
	}
}

// A priority request asks for the Priority tier and is charged for the tier that served it: the
// Priority tier's price when it did, the standard price when Gemini served it on the standard
// tier; the estimate prices the Priority tier.
func TestPriorityChargedAtTheTierServed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	req := request("p")
	req.Tier = gemini.TierPriority
	ctx := context.Background()
	served, err := b.client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b.srv.SetPriorityFallback("", 1)
	downgraded, err := b.client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pricing := testConfig(t, b.srv).Pricing
	price := pricing.Price(primary)
	l := b.srv.Ledger()
	for i, c := range []struct {
		res  gemini.Result
		tier gemini.Tier
	}{{served, gemini.TierPriority}, {downgraded, gemini.TierStandard}} {
		if c.res.Tier != c.tier || l.Bills[i].Tier != string(c.tier) {
			t.Errorf("call %d: served on %s (the fake billed %s), want %s", i, c.res.Tier, l.Bills[i].Tier, c.tier)
		}
		if want := price.Bill(c.res.Usage, c.tier); want == 0 || math.Abs(c.res.CostUSD-want) > 1e-15 {
			t.Errorf("call %d: cost %g, want %g at the %s price", i, c.res.CostUSD, want, c.tier)
		}
	}
	standard := req
	standard.Tier = gemini.TierStandard
	if _, p := pricing.Estimate(req); p <= 0 || math.Abs(p-gemini.PriorityMarkup*mustEstimate(pricing, standard)) > 1e-12 {
		t.Errorf("priority estimate %g, want %g × the standard one", p, gemini.PriorityMarkup)
	}
}

func mustEstimate(p gemini.Pricing, req gemini.Request) float64 {
	_, c := p.Estimate(req)
	return c
}

// A shed flex call ends Generate at once: no fallback to the next model (it would be shed as
// well, and degrade the answer), no breaker change.
func TestShedFlexCallIsItsOwnClass(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.srv.SetShedding("", geminitest.Shedding{Fraction: 1})
	req := request("f")
	req.Tier = gemini.TierFlex
	for range 10 {
		res, err := b.client.Generate(context.Background(), req)
		if gemini.ClassOf(err) != gemini.Shed || res.Calls != 1 {
			t.Fatalf("err %v after %d calls, want a shed error after one", err, res.Calls)
		}
	}
	if l := b.srv.Ledger(); l.Model(fallback).Calls != 0 || l.Total.Shed != 10 {
		t.Errorf("ledger %+v, want ten shed calls on the primary, none on the fallback", l.PerModel)
	}
	if w := b.store.writes(); len(w) != 0 {
		t.Errorf("breaker changes %+v after sheds, want none", w)
	}
	req.Tier = gemini.TierStandard
	if _, err := b.client.Generate(context.Background(), req); err != nil {
		t.Errorf("the standard tier: %v", err)
	}
}

// One attempt is one billed request: a response ending with a continuation token is returned as
// it is, never resent by the SDK's automatic continuation (which would sum a second request's
// usage into the answer without asking).
func TestAutomaticContinuationStaysOff(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		if r.Continuation != "" {
			return geminitest.Reply{Text: " and the rest"}
		}
		return geminitest.Reply{Text: "the first part", ContinuationToken: "more"}
	}))
	res, err := b.client.Generate(context.Background(), request("cont"))
	if err != nil {
		t.Fatal(err)
	}
	l := b.srv.Ledger()
	if l.Total.Calls != 1 || res.Calls != 1 || res.Text != "the first part" || res.Usage != l.Bills[0].Usage {
		t.Errorf("%d calls reached the fake, %d counted, text %q usage %+v: want one request, answered as it came", l.Total.Calls, res.Calls, res.Text, res.Usage)
	}
}

func TestCacheBreakEven(t *testing.T) {
	t.Parallel()
	flash := gemini.DefaultPrices["gemini-2.5-flash"]
	if got, want := flash.CacheBreakEven(1), (0.30+1.00)/(0.30-0.03); math.Abs(got-want) > 1e-12 {
		t.Errorf("N* = %g, want %g (about 5 reuses per hour of TTL)", got, want)
	}
	for _, tc := range []struct {
		n, h float64
		pays bool
	}{{4, 0, false}, {5, 0, true}, {8, 0.5, false}, {10, 0.5, true}} {
		if got := flash.CachePays(tc.n, tc.h, 1); got != tc.pays {
			t.Errorf("CachePays(%g reuses, implicit %g) = %v", tc.n, tc.h, got)
		}
	}
	if noStorage := (gemini.Price{InputPerM: 1, CachedInputPerM: 0.1}); noStorage.CachePays(1e9, 0, 1) {
		t.Error("a model without a storage price is cached")
	}
}
