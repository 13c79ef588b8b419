package worker

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/genbox-dev/genbox/internal/geminienv"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/pkg/gemini"
	"github.com/genbox-dev/genbox/pkg/gemini/geminitest"
)

// Not parallel: it installs global telemetry. Each model call is a span of its task with model,
// attempt, tokens and error class; breaker changes reach the gauge.
//
//nolint:paralleltest // it installs global telemetry
func TestAttemptSpansAndBreakerGauge(t *testing.T) {
	tel := obstest.Install(t)
	srv := geminitest.NewServer()
	t.Cleanup(srv.Close)
	env := map[string]string{"GOOGLE_GEMINI_BASE_URL": srv.URL, "GENBOX_MODEL_CHAIN": "m", "GENBOX_PRICES": "m=1/2",
		"GENBOX_BACKOFF_BASE": "1ms", "GENBOX_BACKOFF_MAX": "2ms"}
	cfg, err := geminienv.Config(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	c, err := gemini.New(context.Background(), cfg, gemini.WithAttemptHook(AttemptSpans(obs.GenAIProviderGemini, tel.Metrics)),
		gemini.WithBreakerStore(MeteredBreakers(nil, tel.Metrics)))
	if err != nil {
		t.Fatal(err)
	}
	srv.FailNext("m", 503)
	res, err := c.Generate(obs.WithTask(context.Background(), "t-1"), gemini.Request{TaskID: "t-1", Tenant: "a", Models: []string{"m"}, Prompt: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	spans := tel.TaskSpans("t-1")
	if len(spans) != 2 || spans[0].Name() != SpanGeminiAttempt || spans[1].Name() != SpanGeminiAttempt {
		t.Fatalf("task spans %v, want two %q", obstest.Names(spans), SpanGeminiAttempt)
	}
	check := func(i int, key string, want any) {
		t.Helper()
		v, _ := obstest.Attr(spans[i], key)
		if v.AsInterface() != want {
			t.Errorf("span %d %s = %v, want %v", i, key, v.AsInterface(), want)
		}
	}
	check(0, obs.SpanAttempt, int64(1))
	check(0, obs.SpanModel, "m")
	check(0, obs.SpanErrorType, string(gemini.Transient))
	check(1, obs.SpanAttempt, int64(2))
	check(1, obs.SpanInputTokens, res.Usage.PromptTokens)
	check(1, obs.SpanOutputTokens, res.Usage.OutputTokens)
	check(1, obs.SpanGenAIOperation, obs.GenAIGenerate)
	check(1, obs.SpanGenAIProvider, obs.GenAIProviderGemini)
	// The GenAI conventions' client metrics, beside genbox's own: one duration per call (the
	// 503 with its error.type), the answer's input and output tokens.
	if got := tel.Sum(t, obs.MetricGenAIDuration, "gen_ai.request.model=m", "error.type=transient"); got != 1 {
		t.Errorf("%s of the failed call: %g points, want 1", obs.MetricGenAIDuration, got)
	}
	if got := tel.Sum(t, obs.MetricGenAIDuration, "gen_ai.operation.name=generate_content"); got != 2 {
		t.Errorf("%s: %g calls, want 2", obs.MetricGenAIDuration, got)
	}
	for kind, want := range map[string]int64{"input": res.Usage.PromptTokens, "output": res.Usage.OutputTokens} {
		var sum float64
		for _, p := range tel.Points(t, obs.MetricGenAITokenUsage) {
			if strings.Contains(p.Attrs, "gen_ai.token.type="+kind) {
				sum += p.Value
			}
		}
		if int64(sum) != want {
			t.Errorf("%s{%s} sums %g, want %d", obs.MetricGenAITokenUsage, kind, sum, want)
		}
	}
	if spans[0].Status().Code != codes.Error || spans[1].Status().Code == codes.Error {
		t.Errorf("span statuses %v, %v; want the 503 failed, the answer not", spans[0].Status(), spans[1].Status())
	}
	if res.Usage.OutputTokens == 0 {
		t.Error("the answer billed no output tokens")
	}

	_ = MeteredBreakers(nil, tel.Metrics).SaveBreaker(context.Background(), gemini.BreakerChange{Model: "m", From: gemini.BreakerClosed, To: gemini.BreakerOpen})
	if got := tel.Sum(t, obs.MetricBreakerState, "model=m"); got != 2 {
		t.Errorf("%s{model=m} = %g, want 2 (open)", obs.MetricBreakerState, got)
	}
}
