package obs

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/pkg/task"
)

// Span attribute keys: OpenTelemetry's semantic conventions (gen_ai.*, error.type) where they
// exist, genbox.* for the rest.
const (
	SpanTaskID       = "genbox.task_id"
	SpanAttempt      = "genbox.attempt"
	SpanModel        = "gen_ai.request.model"
	SpanInputTokens  = "gen_ai.usage.input_tokens"
	SpanOutputTokens = "gen_ai.usage.output_tokens"
	SpanErrorType    = "error.type"
)

// Start starts a span named name on genbox's tracer, tagged with the task id WithTask put in ctx.
// The claim transaction, each Gemini attempt and each webhook POST are such spans.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if id := TaskID(ctx); id != "" {
		attrs = append(attrs, attribute.String(SpanTaskID, id))
	}
	return Tracer().Start(ctx, name, trace.WithAttributes(attrs...))
}

// GenerationAttrs describes one Gemini attempt: its model, attempt number and the tokens it used.
func GenerationAttrs(model string, attempt int, usage task.Usage) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String(SpanModel, model),
		attribute.Int(SpanAttempt, attempt),
		attribute.Int64(SpanInputTokens, usage.PromptTokens),
		attribute.Int64(SpanOutputTokens, usage.OutputTokens),
	}
}

// End ends span, marking it failed with err and its class (a gemini.Class, "timeout", ...) when
// err is not nil. The error text goes on the span; keep content out of error messages.
func End(span trace.Span, err error, class string) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		if class != "" {
			span.SetAttributes(attribute.String(SpanErrorType, class))
		}
	}
	span.End()
}
