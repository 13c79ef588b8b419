package obs

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/genbox-dev/genbox/pkg/task"
)

// OpenTelemetry's GenAI semantic conventions for a model call: its span attributes (beside
// SpanModel and the usage keys above) and the two client metrics, recorded beside genbox's own.
const (
	MetricGenAITokenUsage = "gen_ai.client.token.usage"
	MetricGenAIDuration   = "gen_ai.client.operation.duration"

	SpanGenAIOperation = "gen_ai.operation.name"
	SpanGenAIProvider  = "gen_ai.provider.name"
	AttrGenAITokenType = "gen_ai.token.type"

	// GenAIGenerate is the operation of every genbox model call.
	GenAIGenerate = "generate_content"
	// Providers: the Gemini API, or Vertex AI.
	GenAIProviderGemini = "gcp.gemini"
	GenAIProviderVertex = "gcp.vertex_ai"
)

// Prompt tokens by modality on a model call's span (genbox's: the conventions have none).
const (
	SpanImageTokens    = "genbox.usage.image_tokens"
	SpanAudioTokens    = "genbox.usage.audio_tokens"
	SpanVideoTokens    = "genbox.usage.video_tokens"
	SpanDocumentTokens = "genbox.usage.document_tokens"
)

// GenAIAttrs are the GenAI conventions' attributes of a call to model through provider.
func GenAIAttrs(provider, model string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String(SpanGenAIOperation, GenAIGenerate),
		attribute.String(SpanGenAIProvider, provider),
		attribute.String(SpanModel, model),
	}
}

// ModalityAttrs are the prompt tokens of usage by modality, those it counted.
func ModalityAttrs(usage task.Usage) []attribute.KeyValue {
	var out []attribute.KeyValue
	for _, m := range []struct {
		key string
		n   int64
	}{{SpanImageTokens, usage.ImageTokens}, {SpanAudioTokens, usage.AudioTokens}, {SpanVideoTokens, usage.VideoTokens}, {SpanDocumentTokens, usage.DocumentTokens}} {
		if m.n > 0 {
			out = append(out, attribute.Int64(m.key, m.n))
		}
	}
	return out
}

// genAIInstruments are the GenAI conventions' client metrics, with their advised buckets.
type genAIInstruments struct {
	tokens   metric.Int64Histogram
	duration metric.Float64Histogram
}

func newGenAIInstruments(mt metric.Meter) (genAIInstruments, error) {
	tokens, err := mt.Int64Histogram(MetricGenAITokenUsage, metric.WithUnit("{token}"),
		metric.WithDescription("Number of input and output tokens used."),
		metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864))
	if err != nil {
		return genAIInstruments{}, err
	}
	duration, err := mt.Float64Histogram(MetricGenAIDuration, metric.WithUnit("s"),
		metric.WithDescription("GenAI operation duration."),
		metric.WithExplicitBucketBoundaries(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92))
	return genAIInstruments{tokens: tokens, duration: duration}, err
}

// GenAICall records one model call by the GenAI conventions: its duration (with error.type when
// it failed) and, when it answered, its input and output tokens.
func (m *Metrics) GenAICall(ctx context.Context, provider, model string, usage task.Usage, dur time.Duration, errType string) {
	if m == nil {
		return
	}
	attrs := GenAIAttrs(provider, model)
	if errType != "" {
		attrs = append(attrs, attribute.String(SpanErrorType, errType))
	}
	m.genAI.duration.Record(ctx, dur.Seconds(), metric.WithAttributes(attrs...))
	if errType != "" {
		return
	}
	for _, t := range []struct {
		kind string
		n    int64
	}{{"input", usage.PromptTokens}, {"output", usage.OutputTokens}} {
		m.genAI.tokens.Record(ctx, t.n, metric.WithAttributes(append(attrs, attribute.String(AttrGenAITokenType, t.kind))...))
	}
}
