package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// lines decodes each JSON line of buf.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// spanContext starts a span on a fresh SDK provider (sampled unless sampled is false).
func spanContext(t *testing.T, sampled bool) (context.Context, trace.SpanContext) {
	t.Helper()
	sampler := sdktrace.AlwaysSample()
	if !sampled {
		sampler = sdktrace.NeverSample()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	t.Cleanup(func() { span.End() })
	return ctx, span.SpanContext()
}

func TestLoggerCloudLoggingShape(t *testing.T) {
	t.Parallel()
	ctx, sc := spanContext(t, true)
	var buf bytes.Buffer
	log := NewLogger(&buf, slog.LevelDebug, LogOptions{Project: "proj-1"})

	log.DebugContext(ctx, "d")
	log.InfoContext(ctx, "claimed", "attempt", 2)
	log.WarnContext(ctx, "w")
	log.ErrorContext(ctx, "e")
	log.Info("no context")

	got := lines(t, &buf)
	if len(got) != 5 {
		t.Fatalf("got %d lines, want 5: %s", len(got), buf.String())
	}
	wantSev := []string{"DEBUG", "INFO", "WARNING", "ERROR", "INFO"}
	for i, l := range got {
		if l[KeySeverity] != wantSev[i] {
			t.Errorf("line %d severity = %v, want %s", i, l[KeySeverity], wantSev[i])
		}
		for _, k := range []string{"level", "msg"} {
			if _, ok := l[k]; ok {
				t.Errorf("line %d has slog's %q key: %v", i, k, l)
			}
		}
		if _, ok := l["time"]; !ok {
			t.Errorf("line %d has no time", i)
		}
	}
	l := got[1]
	if l[KeyMessage] != "claimed" || l["attempt"] != float64(2) {
		t.Errorf("line = %v, want message claimed and attempt 2", l)
	}
	if want := "projects/proj-1/traces/" + sc.TraceID().String(); l[KeyTrace] != want {
		t.Errorf("%s = %v, want %s", KeyTrace, l[KeyTrace], want)
	}
	if l[KeySpanID] != sc.SpanID().String() || l[KeyTraceSampled] != true {
		t.Errorf("span fields = %v %v, want %s true", l[KeySpanID], l[KeyTraceSampled], sc.SpanID())
	}
	if _, ok := got[4][KeyTrace]; ok {
		t.Errorf("a line without a span context has a trace: %v", got[4])
	}
}

func TestLoggerUnsampledAndNoProject(t *testing.T) {
	t.Parallel()
	ctx, sc := spanContext(t, false)
	var buf bytes.Buffer
	NewLogger(&buf, slog.LevelInfo, LogOptions{}).InfoContext(ctx, "x")
	l := lines(t, &buf)[0]
	if l[KeyTrace] != sc.TraceID().String() || l[KeyTraceSampled] != false {
		t.Errorf("line = %v, want the bare trace id %s, unsampled", l, sc.TraceID())
	}
}

func TestLoggerTaskIDOnEveryLine(t *testing.T) {
	t.Parallel()
	spanCtx, sc := spanContext(t, true)
	var buf bytes.Buffer
	log := NewLogger(&buf, slog.LevelInfo, LogOptions{Project: "p"})
	ctx := WithTask(spanCtx, "task-42")

	log.InfoContext(ctx, "plain")
	log.With("model", "m1").InfoContext(ctx, "with attrs")
	log.WithGroup("call").InfoContext(ctx, "grouped", "attempt", 3)
	log.With("a", 1).WithGroup("g").With("b", 2).WarnContext(ctx, "nested")
	log.Info("other task")

	got := lines(t, &buf)
	for i, l := range got[:4] {
		if l[KeyTaskID] != "task-42" {
			t.Errorf("line %d task_id = %v, want task-42: %v", i, l[KeyTaskID], l)
		}
		if l[KeyTrace] != "projects/p/traces/"+sc.TraceID().String() {
			t.Errorf("line %d: trace not at the top level: %v", i, l)
		}
	}
	if _, ok := got[4][KeyTaskID]; ok {
		t.Errorf("a line without the task's context has a task_id: %v", got[4])
	}
	if g, _ := got[2]["call"].(map[string]any); g["attempt"] != float64(3) {
		t.Errorf("grouped attribute lost: %v", got[2])
	}
	if g, _ := got[3]["g"].(map[string]any); got[3]["a"] != float64(1) || g["b"] != float64(2) {
		t.Errorf("With/WithGroup order lost: %v", got[3])
	}
	if TaskID(ctx) != "task-42" || TaskID(context.Background()) != "" {
		t.Error("TaskID does not read back WithTask")
	}
}

// The content that must never reach the logs by default.
const (
	prompt = "PROMPT-write a poem about the sea"
	output = "OUTPUT-the sea is wide"
	secret = "SECRET-whsec_abc123"
)

type request struct{ Prompt, Model string }

func logEverything(log *slog.Logger) {
	ctx := WithTask(context.Background(), "t1")
	//nolint:sloglint // keys as any code might spell them: the redaction must not depend on the spelling
	log.InfoContext(ctx, "generate",
		"prompt", prompt,
		"system_instruction", prompt,
		"output", output,
		"output_text", output,
		"responseText", output,
		"api_key", secret,
		"apiKey", secret,
		"GEMINI_API_KEY", secret,
		"webhook_secret", secret,
		"Authorization", "Bearer "+secret,
		"signature", "v1,"+secret,
		"slack_bot_token", secret,
		"prompt_parts", request{Prompt: prompt},
		slog.Group("input", "value", prompt, "nested", slog.Group("x", "y", prompt)),
		"prompts", []string{prompt},
		"body", []byte(output),
		"prompt_tokens", 12,
		"output_tokens", 34,
		"model", "gemini-2.5-flash",
	)
	log.With("secret", secret).WithGroup("payload").ErrorContext(ctx, "delivery failed", "data", output, "error", errors.New("boom"))
}

func TestLoggerRedactsContentAndSecretsByDefault(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logEverything(NewLogger(&buf, slog.LevelDebug, LogOptions{}))
	out := buf.String()
	for _, s := range []string{"PROMPT-", "OUTPUT-", "SECRET-", "whsec"} {
		if strings.Contains(out, s) {
			t.Errorf("default log contains %q:\n%s", s, out)
		}
	}
	l := lines(t, &buf)[0]
	for _, k := range []string{"prompt", "output", "api_key", "apiKey", "Authorization", "signature", "prompt_parts"} {
		if l[k] != Redacted {
			t.Errorf("%s = %v, want %s", k, l[k], Redacted)
		}
	}
	// Counts and plain identifiers stay.
	if l["prompt_tokens"] != float64(12) || l["output_tokens"] != float64(34) || l["model"] != "gemini-2.5-flash" || l[KeyTaskID] != "t1" {
		t.Errorf("non-content attributes were lost: %v", l)
	}
	if msg := lines(t, &buf)[1]; msg[KeyMessage] != "delivery failed" {
		t.Errorf("message = %v", msg[KeyMessage])
	}
}

// The switch exists and is the only way content reaches the logs.
func TestLoggerLogContentShowsContent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logEverything(NewLogger(&buf, slog.LevelDebug, LogOptions{LogContent: true}))
	out := buf.String()
	for _, s := range []string{prompt, output, secret} {
		if !strings.Contains(out, s) {
			t.Errorf("LogContent log lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, Redacted) {
		t.Errorf("LogContent log redacted something:\n%s", out)
	}
}

func TestSensitive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key  string
		want bool
	}{
		{"prompt", true}, {"Prompts", true}, {"user_input", true}, {"output", true}, {"outputText", true},
		{"text", true}, {"secret", true}, {"SLACK_SIGNING_SECRET", true}, {"token", true},
		{"id_token", true}, {"api_key", true}, {"apiKey", true}, {"x-api-key", true},
		{"authorization", true}, {"webhook-signature", true}, {"password", true}, {"contents", true},
		{"task_id", false}, {"model", false}, {"attempt", false}, {"tenant", false}, {"key", false},
		{"idempotency_key", false}, {"status", false}, {"context", false}, {"delivery_attempt", false},
		{"error", false}, {"family", false},
	}
	for _, tt := range tests {
		if got := sensitive(tt.key); got != tt.want {
			t.Errorf("sensitive(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
}

func TestLoggerLevel(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := NewLogger(&buf, slog.LevelWarn, LogOptions{})
	log.Info("hidden")
	log.Warn("shown")
	if got := lines(t, &buf); len(got) != 1 || got[0][KeyMessage] != "shown" {
		t.Errorf("got %v, want only the warning", got)
	}
}

// FuzzRedaction: whatever the value, under a key ending in a sensitive word it never reaches a
// default log, neither at the top level nor in a group.
func FuzzRedaction(f *testing.F) {
	f.Add("user", "hello world", uint8(0))
	f.Add("gemini", "AIzaSyXXXX", uint8(5))
	f.Add("", "\"quoted\"\n", uint8(2))
	var list []string
	for w := range sensitiveWords {
		list = append(list, w)
	}
	slices.Sort(list)
	f.Fuzz(func(t *testing.T, prefix, value string, pick uint8) {
		key := prefix + "_" + list[int(pick)%len(list)]
		if !sensitive(key) {
			t.Fatalf("sensitive(%q) = false", key)
		}
		if !utf8.ValidString(key) || len(value) < 4 || strings.Contains(Redacted, value) {
			return
		}
		var buf bytes.Buffer
		NewLogger(&buf, slog.LevelInfo, LogOptions{}).Info("m", key, value, slog.Group("g", key, value))
		var l map[string]any
		if err := json.Unmarshal(buf.Bytes(), &l); err != nil {
			t.Fatalf("not JSON: %v", err)
		}
		if l[key] != Redacted {
			t.Errorf("%q = %v, want redacted", key, l[key])
		}
		if g, _ := l["g"].(map[string]any); g[key] != Redacted {
			t.Errorf("g.%q = %v, want redacted", key, g[key])
		}
	})
}

// A task_id the caller adds beside the context's is not written twice: one key per line.
func TestLoggerOneTaskIDKey(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := NewLogger(&buf, slog.LevelInfo, LogOptions{})
	ctx := WithTask(context.Background(), "t-1")
	log.With("task_id", "t-1", "epoch", 2).InfoContext(ctx, "with")
	log.InfoContext(ctx, "record", "task_id", "t-1", "n", 1)
	log.With("task_id", "t-1").WithGroup("g").InfoContext(ctx, "grouped", "task_id", "inner")
	log.With("task_id", "t-2").Info("no context")
	raw := strings.Split(strings.TrimSpace(buf.String()), "\n")
	for i, want := range []int{1, 1, 2, 1} {
		if n := strings.Count(raw[i], `"task_id"`); n != want {
			t.Errorf("line %d has %d task_id keys, want %d: %s", i, n, want, raw[i])
		}
	}
	got := lines(t, &buf)
	if got[0]["epoch"] != float64(2) || got[1]["n"] != float64(1) || got[3][KeyTaskID] != "t-2" {
		t.Errorf("other attributes lost: %v", got)
	}
	if g, _ := got[2]["g"].(map[string]any); g["task_id"] != "inner" || got[2][KeyTaskID] != "t-1" {
		t.Errorf("grouped line %v, want the group's own task_id kept", got[2])
	}
}
