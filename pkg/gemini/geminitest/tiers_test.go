package geminitest_test

import (
	"net/http"
	"strings"
	"testing"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

func TestFlexTierIsReportedAndShed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	flex := &genai.GenerateContentConfig{ServiceTier: genai.ServiceTierFlex}
	r, err := b.generate(ctx, model, "p", flex)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.generate(ctx, model, "p", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.UsageMetadata.TrafficType != genai.TrafficTypeOnDemandFlex || s.UsageMetadata.TrafficType != genai.TrafficTypeOnDemand {
		t.Errorf("trafficType flex %q, standard %q; want ON_DEMAND_FLEX and ON_DEMAND", r.UsageMetadata.TrafficType, s.UsageMetadata.TrafficType)
	}
	b.srv.SetShedding(model, geminitest.Shedding{Func: func(r geminitest.Request) bool { return strings.Contains(r.Prompt, "shed me") }})
	_, err = b.generate(ctx, model, "shed me", flex)
	if e := apiError(t, err); e.Code != http.StatusServiceUnavailable || e.Status != "UNAVAILABLE" {
		t.Errorf("a shed flex request: %v, want 503 UNAVAILABLE", err)
	}
	if _, err := b.generate(ctx, model, "shed me", nil); err != nil {
		t.Errorf("the same request on the standard tier: %v, want it served", err)
	}
	b.srv.SetShedding(model, geminitest.Shedding{Fraction: 0.2})
	shed := 0
	for range 200 {
		if _, err := b.generate(ctx, model, "q", flex); err != nil {
			shed++
		}
	}
	if shed < 20 || shed > 60 {
		t.Errorf("shed %d of 200 at a fraction of 0.2", shed)
	}
	l := b.srv.Ledger()
	if l.Total.Shed != shed+1 || l.Bills[0].Tier != geminitest.TierFlex || l.Bills[1].Tier != geminitest.TierStandard {
		t.Errorf("ledger shed %d (want %d), first tiers %s %s", l.Total.Shed, shed+1, l.Bills[0].Tier, l.Bills[1].Tier)
	}
}

// The fake answers a resumable answer as Gemini does: the SDK's automatic continuation, when on,
// sends the request again and pays for a second call.
func TestContinuationTokenIsFollowedOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		if r.Continuation == "" {
			return geminitest.Reply{Text: "first half", ContinuationToken: "resume-here"}
		}
		return geminitest.Reply{Text: " second half"}
	}))
	ctx := t.Context()
	off := false
	r, err := b.generate(ctx, model, "p", &genai.GenerateContentConfig{AutomaticContinuation: &off})
	if err != nil {
		t.Fatal(err)
	}
	if r.Text() != "first half" || r.Candidates[0].FinishReason != genai.FinishReasonContinuation || b.srv.Ledger().Total.Generations != 1 {
		t.Errorf("continuation off: %q %s after %d calls, want the first half alone", r.Text(), r.Candidates[0].FinishReason, b.srv.Ledger().Total.Generations)
	}
	r, err = b.generate(ctx, model, "p", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Text() != "first half second half" || b.srv.Ledger().Total.Generations != 3 {
		t.Errorf("continuation on: %q after %d calls in all, want both halves and a second billed call", r.Text(), b.srv.Ledger().Total.Generations)
	}
}
