package bus

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/pkg/task"
)

// Messaging span attributes of OpenTelemetry's semantic conventions.
const (
	attrSystem      = "messaging.system"
	attrDestination = "messaging.destination.name"
	attrOperation   = "messaging.operation.type"
	attrMessageID   = "messaging.message.id"
	attrDelivery    = "messaging.gcp_pubsub.message.delivery_attempt"
	systemPubSub    = "gcp_pubsub"
)

// messageTrace carries trace context in message attributes: W3C traceparent and tracestate,
// and nothing else. Baggage is not carried: it may come from a public caller (whatever it
// chooses to put in every downstream message, up to the attribute size limit that would make
// a publish fail) and genbox itself sets none.
var messageTrace propagation.TextMapPropagator = propagation.TraceContext{}

// startPublish starts the producer span of a publish to topic; its context is the one injected
// into the message, so the consumer's span is its child.
func startPublish(ctx context.Context, topic string) (context.Context, trace.Span) {
	return obs.Tracer().Start(ctx, "publish "+topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String(attrSystem, systemPubSub), attribute.String(attrDestination, topic),
			attribute.String(attrOperation, "publish")))
}

// endPublish ends a producer span with the message id or the error.
func endPublish(span trace.Span, id string, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String(attrMessageID, id))
	}
	span.End()
}

// process hands m to h inside a consumer span that continues the trace carried by m's
// attributes (messageTrace), so one task's spans form one trace across services. A message
// that names a task (task.AttrTaskID) puts it in the context (obs.WithTask): every line the
// handler logs and every span it starts carries it.
func process(ctx context.Context, h Handler, subscription string, m *Message) Result {
	ctx = messageTrace.Extract(ctx, propagation.MapCarrier(m.Attributes))
	attrs := []attribute.KeyValue{attribute.String(attrSystem, systemPubSub), attribute.String(attrDestination, subscription),
		attribute.String(attrOperation, "process"), attribute.String(attrMessageID, m.ID),
		attribute.Int(attrDelivery, m.DeliveryAttempt)}
	if id := m.Attributes[task.AttrTaskID]; id != "" {
		ctx = obs.WithTask(ctx, id)
		attrs = append(attrs, attribute.String(obs.SpanTaskID, id))
	}
	ctx, span := obs.Tracer().Start(ctx, "process "+subscription, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...))
	defer span.End()
	res := h.Handle(ctx, m)
	if res == Nack {
		span.SetStatus(codes.Error, "nack")
	}
	return res
}

// pushSubscription is the short name of a push envelope's subscription
// (projects/p/subscriptions/name).
func pushSubscription(full string) string {
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[i+1:]
	}
	return full
}
