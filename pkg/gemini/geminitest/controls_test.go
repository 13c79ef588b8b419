package geminitest_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

func TestStream(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithLatency(model, geminitest.Fixed(3*time.Millisecond)))
	var text strings.Builder
	chunks, withUsage := 0, 0
	var last *genai.GenerateContentResponse
	for r, err := range b.client.Models.GenerateContentStream(t.Context(), model, genai.Text("stream task s-1"), nil) {
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		chunks++
		text.WriteString(r.Text())
		if r.UsageMetadata != nil {
			withUsage++
		}
		last = r
	}
	if chunks < 2 || withUsage != 1 || last.UsageMetadata == nil {
		t.Fatalf("%d chunks, %d with usage (last %+v), want several with usage on the last", chunks, withUsage, last)
	}
	if last.Candidates[0].FinishReason != genai.FinishReasonStop {
		t.Errorf("last finishReason %q", last.Candidates[0].FinishReason)
	}
	whole, err := b.generate(t.Context(), model, "stream task s-1", nil)
	if err != nil {
		t.Fatalf("GenerateContent: %v", err)
	}
	if text.String() != whole.Text() {
		t.Errorf("streamed %q, generated %q: want the same answer", text.String(), whole.Text())
	}
	if got, want := b.srv.Ledger().BilledFor("s-1"), usageOf(t, last).Add(usageOf(t, whole)); got != want {
		t.Errorf("billed %+v, client saw %+v", got, want)
	}
}

func TestCountTokensIsFreeAndUnlimited(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithLimits(model, geminitest.Limits{RPM: 1}))
	ctx := t.Context()
	var counted int32
	for range 3 {
		r, err := b.client.Models.CountTokens(ctx, model, genai.Text("count task k-1"), nil)
		if err != nil {
			t.Fatalf("CountTokens: %v", err)
		}
		counted = r.TotalTokens
	}
	g, err := b.generate(ctx, model, "count task k-1", nil)
	if err != nil {
		t.Fatalf("GenerateContent after countTokens: %v", err)
	}
	if counted != g.UsageMetadata.PromptTokenCount {
		t.Errorf("countTokens said %d, generation billed %d prompt tokens", counted, g.UsageMetadata.PromptTokenCount)
	}
	if l := b.srv.Ledger().Model(model); l.CountTokens != 3 || l.Calls != 1 || l.Billed != usageOf(t, g) {
		t.Errorf("ledger = %+v, want 3 free countTokens and one billed call", l)
	}
}

func TestRPM(t *testing.T) {
	t.Parallel()
	const rpm = 3
	b := setup(t, geminitest.WithLimits(model, geminitest.Limits{RPM: rpm}))
	ctx := t.Context()
	for i := range rpm {
		if _, err := b.generate(ctx, model, "rpm", nil); err != nil {
			t.Fatalf("call %d within the limit: %v", i, err)
		}
	}
	_, err := b.generate(ctx, model, "rpm", nil)
	e := apiError(t, err)
	d, ok := retryDelay(e)
	if e.Code != http.StatusTooManyRequests || e.Status != "RESOURCE_EXHAUSTED" || !ok || d <= 0 || d > time.Minute {
		t.Fatalf("call %d: %+v (delay %v), want 429 with a RetryInfo delay within the minute", rpm+1, e, d)
	}
	if _, err := b.generate(ctx, "gemini-2.5-pro", "rpm", nil); err != nil {
		t.Errorf("another model is limited too: %v", err)
	}
	if l := b.srv.Ledger().Model(model); l.Generations != rpm || l.Failed != 1 {
		t.Errorf("ledger = %+v", l)
	}
}

func TestRPMWindowSlides(t *testing.T) {
	t.Parallel()
	const window = 200 * time.Millisecond
	b := setup(t, geminitest.WithLimits("", geminitest.Limits{RPM: 1, Window: window}))
	ctx := t.Context()
	// On a loaded machine a call may outlast the window; call until one lands inside it.
	var err error
	for i := 0; err == nil; i++ {
		if i == 100 {
			t.Fatal("never limited")
		}
		_, err = b.generate(ctx, model, "w", nil)
	}
	d, ok := retryDelay(apiError(t, err))
	if !ok || d <= 0 || d > window {
		t.Fatalf("retry delay %v (%v), want within the window", d, ok)
	}
	time.Sleep(d) // the server said when to come back: honoring it must work
	if _, err := b.generate(ctx, model, "w", nil); err != nil {
		t.Fatalf("after the advertised retry delay: %v", err)
	}
}

func TestTPM(t *testing.T) {
	t.Parallel()
	prompt := strings.Repeat("x", 400) // 100 prompt tokens
	b := setup(t, geminitest.WithLimits(model, geminitest.Limits{TPM: 250}))
	ctx := t.Context()
	for i := range 2 {
		if _, err := b.generate(ctx, model, prompt, nil); err != nil {
			t.Fatalf("call %d within the token limit: %v", i, err)
		}
	}
	_, err := b.generate(ctx, model, prompt, nil)
	e := apiError(t, err)
	if _, ok := retryDelay(e); e.Code != http.StatusTooManyRequests || !ok || !strings.Contains(e.Message, "input_tokens") {
		t.Fatalf("third call: %+v, want 429 on the token quota with a delay", e)
	}
	if _, err := b.generate(ctx, model, "small", nil); err != nil {
		t.Errorf("a call that fits the remaining tokens: %v", err)
	}
}

func TestOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	b.srv.Outage(model, time.Hour)
	_, err := b.generate(ctx, model, "o", nil)
	if e := apiError(t, err); e.Code != http.StatusServiceUnavailable || e.Status != "UNAVAILABLE" {
		t.Fatalf("during the outage: %+v, want 503 UNAVAILABLE", e)
	}
	if _, err := b.generate(ctx, "gemini-2.5-pro", "o", nil); err != nil {
		t.Fatalf("another model during the outage: %v", err)
	}
	b.srv.Restore(model)
	if _, err := b.generate(ctx, model, "o", nil); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	b.srv.Outage(model, 20*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := b.generate(ctx, model, "o", nil)
		if err == nil {
			break
		}
		if apiError(t, err).Code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("after the outage window: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if l := b.srv.Ledger().Model(model); l.Failed < 1 || l.Generations != 2 {
		t.Errorf("ledger = %+v, want the outage's failures unbilled", l)
	}
}

func TestFailureSchedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.FailNext(model, 503, 503, 0, 500)
	b.srv.FailNext("", 429)
	want := []int{503, 503, 0, 500, 429, 0}
	for i, code := range want {
		_, err := b.generate(t.Context(), model, "f", nil)
		switch {
		case code == 0 && err != nil:
			t.Fatalf("call %d: %v, want success", i, err)
		case code != 0 && apiError(t, err).Code != code:
			t.Fatalf("call %d: %v, want %d", i, err, code)
		}
	}
	if l := b.srv.Ledger().Model(model); l.Calls != 6 || l.Generations != 2 || l.Failed != 4 {
		t.Errorf("ledger = %+v", l)
	}
}

// TestAbandonedGenerationIsBilled covers the crash window: the client goes away while the model
// is generating; the generation finishes and is billed, as on a real invoice.
func TestAbandonedGenerationIsBilled(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithLatency(model, geminitest.Fixed(5*time.Millisecond)))
	gate := b.srv.Block(model)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := b.generate(ctx, model, "task z-9 (worker crashes)", nil)
		errc <- err
	}()
	select {
	case req := <-gate.Entered():
		if !strings.Contains(req.Prompt, "z-9") {
			t.Fatalf("held %+v", req)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the model")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v, want context.Canceled", err)
	}
	if l := b.srv.Ledger(); len(l.BillsFor("z-9")) != 0 || b.srv.InFlight() != 1 {
		t.Fatalf("billed before the generation finished: %+v", l)
	}
	gate.Release()
	if err := b.srv.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	bills := b.srv.Ledger().BillsFor("z-9")
	if len(bills) != 1 || !bills[0].Abandoned || bills[0].Usage.TotalTokens == 0 {
		t.Fatalf("bills for z-9 = %+v, want one abandoned billed generation", bills)
	}
	if got := b.srv.Ledger().Model(model); got.Abandoned != 1 || got.Generations != 1 {
		t.Errorf("tally = %+v", got)
	}
}

func TestLatencyOrdersCompletions(t *testing.T) {
	t.Parallel()
	const slow = 300 * time.Millisecond
	b := setup(t,
		geminitest.WithLatency("slow-model", geminitest.Uniform(slow, slow+10*time.Millisecond)),
		geminitest.WithLatency("", geminitest.Latency{Func: func(geminitest.Request) time.Duration { return time.Millisecond }}))
	ctx := t.Context()
	var wg sync.WaitGroup
	var slowTook time.Duration
	wg.Go(func() {
		start := time.Now()
		if _, err := b.generate(ctx, "slow-model", "slow", nil); err != nil {
			t.Errorf("slow: %v", err)
		}
		slowTook = time.Since(start)
	})
	deadline := time.Now().Add(10 * time.Second)
	for b.srv.InFlight() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, err := b.generate(ctx, model, "fast", nil); err != nil {
		t.Fatalf("fast: %v", err)
	}
	wg.Wait()
	bills := b.srv.Ledger().Bills
	if len(bills) != 2 || bills[0].Request.Model != model || bills[1].Request.Model != "slow-model" {
		t.Fatalf("bills in order %+v, want the fast model's first", bills)
	}
	if slowTook < slow {
		t.Errorf("slow call answered after %v, before its latency %v", slowTook, slow)
	}
}

func TestAPIKey(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithAPIKey("right"))
	_, err := b.generate(t.Context(), model, "k", nil)
	if e := apiError(t, err); e.Code != http.StatusBadRequest || !strings.Contains(e.Message, "API key not valid") {
		t.Fatalf("wrong key: %+v", e)
	}
	resp, err := http.Post(b.srv.URL+"/v1beta/models/"+model+":generateContent", "application/json", strings.NewReader(`{"contents":[{"parts":[{"text":"k"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("no key: status %d, want 403", resp.StatusCode)
	}
	if l := b.srv.Ledger().Total; l.Calls != 0 {
		t.Errorf("unauthorized calls reached the model: %+v", l)
	}
}

func TestCloseEndsHeldCallsUnbilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gate := b.srv.Block("")
	errc := make(chan error, 1)
	go func() {
		_, err := b.generate(t.Context(), model, "held at shutdown", nil)
		errc <- err
	}()
	select {
	case <-gate.Entered():
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the model")
	}
	b.srv.Close() // must not wait for the gate
	if e := apiError(t, <-errc); e.Code != http.StatusServiceUnavailable {
		t.Fatalf("held call at shutdown: %+v, want 503", e)
	}
	if l := b.srv.Ledger().Model(model); l.Generations != 0 || l.Failed != 1 || b.srv.InFlight() != 0 {
		t.Fatalf("ledger = %+v, in flight %d: want the held call failed and unbilled", l, b.srv.InFlight())
	}
}

// A latency is drawn only for a call that generates: a call the responder fails is answered at
// once, so a Latency.Func counting calls in flight counts none of them (the bench's peak of a
// tenant's calls once counted its retries on top of the 503s they followed).
func TestLatencyDrawnOnlyForGenerations(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var drawn []string
	b := setup(t,
		geminitest.WithLatency("", geminitest.Latency{Func: func(r geminitest.Request) time.Duration {
			mu.Lock()
			drawn = append(drawn, r.Prompt)
			mu.Unlock()
			return time.Millisecond
		}}),
		geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
			if strings.HasPrefix(r.Prompt, "fail") {
				return geminitest.Reply{Code: http.StatusServiceUnavailable, Message: "The model is overloaded."}
			}
			return geminitest.DefaultReply(r)
		}))
	for _, p := range []string{"ok-1", "fail-1", "ok-2", "fail-2"} {
		_, err := b.generate(t.Context(), model, p, nil)
		if failed := err != nil; failed != strings.HasPrefix(p, "fail") {
			t.Fatalf("%s: error %v", p, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"ok-1", "ok-2"}; !slices.Equal(drawn, want) {
		t.Errorf("latencies drawn for %q, want %q: only the calls that generated", drawn, want)
	}
}
