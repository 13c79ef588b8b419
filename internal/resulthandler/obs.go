package resulthandler

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/safetext"
)

// Option configures a Handler.
type Option func(*Handler)

// WithMetrics records every webhook attempt (outcome, latency) and delivery retries in m.
func WithMetrics(m *obs.Metrics) Option { return func(h *Handler) { h.metrics = m } }

// RetryClassDelivery is the genbox.retries class of a webhook delivery scheduled again.
const RetryClassDelivery = "delivery"

// Span attributes of a webhook POST.
const (
	spanEventID    = "genbox.event_id"
	spanHTTPStatus = "http.response.status_code"
)

// observedPost is post inside a "webhook POST" span, metered by outcome and duration.
func (h *Handler) observedPost(ctx context.Context, c claim) outcome {
	ctx, span := obs.Start(ctx, "webhook POST", attribute.String(spanEventID, c.eventID), attribute.Int(obs.SpanAttempt, c.attempt))
	start := time.Now()
	o := h.post(ctx, c)
	// The error quotes what the receiver answered and the URL it was sent to: bounded and
	// redacted once, here, it is the same text in the span, the log line, the task and Slack.
	o.err = safetext.Error(o.err)
	h.metrics.WebhookAttempt(ctx, o.kind.String(), time.Since(start))
	if o.kind == retry {
		h.metrics.Retry(ctx, RetryClassDelivery)
	}
	if o.status != 0 {
		span.SetAttributes(attribute.Int(spanHTTPStatus, o.status))
	}
	var err error
	if o.kind != delivered {
		err = errors.New(o.err)
	}
	obs.End(span, err, o.kind.String())
	return o
}
