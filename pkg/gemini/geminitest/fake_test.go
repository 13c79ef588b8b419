package geminitest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
	"github.com/genbox-dev/genbox/pkg/task"
)

const model = "gemini-2.5-flash"

type bundle struct {
	srv    *geminitest.Server
	client *genai.Client
}

func setup(t *testing.T, opts ...geminitest.Option) bundle {
	t.Helper()
	srv := geminitest.NewServer(opts...)
	t.Cleanup(srv.Close)
	client, err := genai.NewClient(t.Context(), srv.ClientConfig())
	if err != nil {
		t.Fatalf("genai.NewClient: %v", err)
	}
	return bundle{srv: srv, client: client}
}

func (b bundle) generate(ctx context.Context, model, prompt string, cfg *genai.GenerateContentConfig) (*genai.GenerateContentResponse, error) {
	return b.client.Models.GenerateContent(ctx, model, genai.Text(prompt), cfg)
}

func usageOf(t *testing.T, r *genai.GenerateContentResponse) task.Usage {
	t.Helper()
	u := r.UsageMetadata
	if u == nil {
		t.Fatalf("no usageMetadata in %+v", r)
	}
	if u.PromptTokenCount <= 0 || u.CandidatesTokenCount <= 0 || u.TotalTokenCount != u.PromptTokenCount+u.CandidatesTokenCount {
		t.Fatalf("usageMetadata = %+v, want positive counts that add up", u)
	}
	return task.Usage{PromptTokens: int64(u.PromptTokenCount), OutputTokens: int64(u.CandidatesTokenCount), TotalTokens: int64(u.TotalTokenCount)}
}

// apiError returns err as the genai.APIError the SDK returns by value.
func apiError(t *testing.T, err error) genai.APIError {
	t.Helper()
	var e genai.APIError
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a genai.APIError", err, err)
	}
	return e
}

// retryDelay reads the google.rpc.RetryInfo detail of e.
func retryDelay(e genai.APIError) (time.Duration, bool) {
	for _, d := range e.Details {
		if d["@type"] != "type.googleapis.com/google.rpc.RetryInfo" {
			continue
		}
		s, _ := d["retryDelay"].(string)
		dur, err := time.ParseDuration(s)
		return dur, err == nil
	}
	return 0, false
}

func TestGenerateText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	temp := float32(0.2)
	cfg := &genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText("be brief", genai.RoleUser), Temperature: &temp}

	r1, err := b.generate(ctx, model, "describe task t-1", cfg)
	if err != nil {
		t.Fatalf("GenerateContent: %v", err)
	}
	usageOf(t, r1)
	if r1.Text() == "" || r1.ModelVersion != model || r1.Candidates[0].FinishReason != genai.FinishReasonStop {
		t.Fatalf("answer = %q, modelVersion %q, finishReason %q", r1.Text(), r1.ModelVersion, r1.Candidates[0].FinishReason)
	}
	r2, err := b.generate(ctx, model, "describe task t-1", cfg)
	if err != nil {
		t.Fatalf("GenerateContent again: %v", err)
	}
	if r2.Text() != r1.Text() {
		t.Errorf("same request answered %q then %q, want deterministic", r1.Text(), r2.Text())
	}
	for name, other := range map[string]func() (*genai.GenerateContentResponse, error){
		"prompt": func() (*genai.GenerateContentResponse, error) {
			return b.generate(ctx, model, "describe task t-2", cfg)
		},
		"model": func() (*genai.GenerateContentResponse, error) {
			return b.generate(ctx, "gemini-2.5-pro", "describe task t-1", cfg)
		},
		"config": func() (*genai.GenerateContentResponse, error) {
			return b.generate(ctx, model, "describe task t-1", nil)
		},
	} {
		r, err := other()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Text() == r1.Text() {
			t.Errorf("changing the %s kept the answer %q", name, r.Text())
		}
	}
}

func TestErrorsSurfaceAsAPIError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code   int
		status string
		delay  time.Duration
	}{
		{http.StatusBadRequest, "INVALID_ARGUMENT", 0},
		{http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", 2 * time.Second},
		{http.StatusInternalServerError, "INTERNAL", 0},
		{http.StatusServiceUnavailable, "UNAVAILABLE", 0},
	}
	for _, tt := range tests {
		t.Run(tt.status, func(t *testing.T) {
			t.Parallel()
			b := setup(t, geminitest.WithRetryDelay(2*time.Second))
			b.srv.FailNext(model, tt.code)
			_, err := b.generate(t.Context(), model, "hello", nil)
			e := apiError(t, err)
			if e.Code != tt.code || e.Status != tt.status || e.Message == "" {
				t.Fatalf("APIError = %+v, want code %d status %s and a message", e, tt.code, tt.status)
			}
			d, ok := retryDelay(e)
			if tt.delay > 0 && (!ok || d != tt.delay) {
				t.Fatalf("retry delay = %v (found %v), want %v", d, ok, tt.delay)
			}
			if tt.delay == 0 && ok {
				t.Fatalf("unexpected RetryInfo in %+v", e.Details)
			}
			l := b.srv.Ledger().Model(model)
			if l.Calls != 1 || l.Failed != 1 || l.Generations != 0 || l.Billed != (task.Usage{}) {
				t.Fatalf("ledger = %+v, want one failed unbilled call", l)
			}
		})
	}
}

func TestInvalidRequestIs400(t *testing.T) {
	t.Parallel()
	b := setup(t)
	temp := float32(3)
	_, err := b.generate(t.Context(), model, "hello", &genai.GenerateContentConfig{Temperature: &temp})
	if e := apiError(t, err); e.Code != http.StatusBadRequest || e.Status != "INVALID_ARGUMENT" || !strings.Contains(e.Message, "temperature") {
		t.Fatalf("APIError = %+v, want 400 INVALID_ARGUMENT about temperature", e)
	}
}

func TestLedgerBillsWhatTheClientSaw(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	var seen task.Usage
	prompts := []string{"task a-1 first", "task a-1 second", "task b-2", "a much longer prompt for task c-3 " + strings.Repeat("words ", 40)}
	for _, p := range prompts {
		r, err := b.generate(ctx, model, p, nil)
		if err != nil {
			t.Fatalf("GenerateContent(%q): %v", p, err)
		}
		seen = seen.Add(usageOf(t, r))
	}
	b.srv.FailNext(model, http.StatusServiceUnavailable)
	if _, err := b.generate(ctx, model, "task a-1 failed", nil); err == nil {
		t.Fatal("scripted 503 succeeded")
	}
	l := b.srv.Ledger()
	if l.Total.Billed != seen {
		t.Errorf("billed %+v, client saw %+v", l.Total.Billed, seen)
	}
	if got := l.Model(model); got.Calls != 5 || got.Generations != 4 || got.Failed != 1 || got.Abandoned != 0 {
		t.Errorf("tally = %+v, want 5 calls, 4 generations, 1 failure", got)
	}
	if n := len(l.BillsFor("a-1")); n != 2 {
		t.Errorf("task a-1 billed %d times, want 2", n)
	}
	if u := l.BilledFor("c-3"); u.PromptTokens <= l.BilledFor("b-2").PromptTokens {
		t.Errorf("longer prompt billed %d prompt tokens, not more than the short one", u.PromptTokens)
	}
}

func TestResponderScriptsOutputs(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []geminitest.Request
	b := setup(t, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r)
		if r.Call == 0 {
			return geminitest.Reply{Text: "{not json"}
		}
		return geminitest.DefaultReply(r)
	}))
	ctx := t.Context()
	temp := float32(0.5)
	cfg := &genai.GenerateContentConfig{Temperature: &temp, ResponseMIMEType: "application/json"}
	r, err := b.generate(ctx, model, "task r-1", cfg)
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	if json.Valid([]byte(r.Text())) {
		t.Fatalf("first answer %q is valid JSON, want the scripted invalid one", r.Text())
	}
	r, err = b.generate(ctx, model, "task r-1", cfg)
	if err != nil {
		t.Fatalf("second call: %v", err)
	}
	if !json.Valid([]byte(r.Text())) {
		t.Fatalf("second answer %q is not JSON", r.Text())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[1].Call != 1 || seen[1].Model != model || seen[1].Prompt != "task r-1" ||
		seen[1].Temperature == nil || *seen[1].Temperature != float64(temp) {
		t.Fatalf("responder saw %+v", seen)
	}
}

func TestSafetyBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t, geminitest.WithResponder(func(r geminitest.Request) geminitest.Reply {
		if strings.Contains(r.Prompt, "blocked prompt") {
			return geminitest.Reply{BlockReason: "SAFETY"}
		}
		return geminitest.Reply{FinishReason: "SAFETY"}
	}))
	r, err := b.generate(t.Context(), model, "blocked prompt", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Candidates) != 0 || r.PromptFeedback == nil || r.PromptFeedback.BlockReason != genai.BlockedReasonSafety {
		t.Fatalf("blocked prompt answered %+v", r)
	}
	r, err = b.generate(t.Context(), model, "blocked answer", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Text() != "" || r.Candidates[0].FinishReason != genai.FinishReasonSafety {
		t.Fatalf("blocked answer %+v", r.Candidates[0])
	}
	if l := b.srv.Ledger().Model(model); l.Generations != 2 || l.Billed.OutputTokens != 0 || l.Billed.PromptTokens == 0 {
		t.Errorf("ledger = %+v, want prompt tokens billed only", l)
	}
}
