package bus_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/internal/bus"
	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
	"github.com/genbox-dev/genbox/pkg/task"
)

// useRecorder installs a global tracer provider recording every span, as a service's telemetry
// setup installs an exporting one. Tests using it must not be parallel.
func useRecorder(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	prevP, prevTP := otel.GetTextMapPropagator(), otel.GetTracerProvider()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTextMapPropagator(prevP)
		otel.SetTracerProvider(prevTP)
		_ = tp.Shutdown(context.Background())
	})
	return rec
}

func ended(rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// Publish makes a producer span under the caller's; Pull hands the message to the handler inside
// a consumer span that is the producer's child: one trace across Pub/Sub.
//
//nolint:paralleltest // it installs the global tracer provider (useRecorder)
func TestPublishAndPullSpans(t *testing.T) {
	rec := useRecorder(t)
	f := setupFake(t)
	got := make(chan trace.SpanContext, 1)
	f.pull(t, bus.SubWorker, bus.HandlerFunc(func(ctx context.Context, _ *bus.Message) bus.Result {
		if obs.TaskID(ctx) != "t1" {
			t.Errorf("handler context task id %q, want t1", obs.TaskID(ctx))
		}
		got <- trace.SpanContextFromContext(ctx)
		return bus.Ack
	}))
	ctx, root := otel.Tracer("test").Start(t.Context(), "submit")
	id, err := f.p.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: "t1"})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	var handled trace.SpanContext
	select {
	case handled = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("message never handled")
	}
	pub := ended(rec, "publish "+bus.TopicTasks)
	if pub == nil || pub.SpanKind() != trace.SpanKindProducer || pub.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("producer span %v, want a producer child of the caller's span", pub)
	}
	if m := f.srv.Message(id); m == nil || !strings.Contains(m.Attributes["traceparent"], pub.SpanContext().SpanID().String()) {
		t.Errorf("message traceparent does not name the producer span: %+v", m)
	}
	deadline := time.Now().Add(10 * time.Second)
	var proc sdktrace.ReadOnlySpan
	for proc == nil && time.Now().Before(deadline) {
		proc = ended(rec, "process "+bus.SubWorker)
		time.Sleep(10 * time.Millisecond)
	}
	if proc == nil || proc.SpanKind() != trace.SpanKindConsumer || proc.Parent().SpanID() != pub.SpanContext().SpanID() {
		t.Fatalf("consumer span %v, want a consumer child of the producer span", proc)
	}
	if v, _ := obstest.Attr(proc, obs.SpanTaskID); v.AsString() != "t1" {
		t.Errorf("consumer span task id %q, want t1", v.AsString())
	}
	if handled.SpanID() != proc.SpanContext().SpanID() || handled.TraceID() != root.SpanContext().TraceID() {
		t.Errorf("handler ran in span %v, want the consumer span %v of the caller's trace", handled.SpanID(), proc.SpanContext().SpanID())
	}
}

// A message carries the trace context and nothing else of the caller's context: baggage, which a
// public caller can set, stays out of its attributes even under a propagator that carries it.
func TestPublishCarriesNoBaggage(t *testing.T) { //nolint:paralleltest // sets the global propagator and tracer provider
	useRecorder(t)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	f := setupFake(t)
	m, _ := baggage.NewMember("tenant", strings.Repeat("x", 2000))
	b, _ := baggage.New(m)
	ctx, root := otel.Tracer("test").Start(baggage.ContextWithBaggage(t.Context(), b), "submit")
	id, err := f.p.Publish(ctx, bus.TopicTasks, nil, map[string]string{task.AttrTaskID: "t1"})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	msg := f.srv.Message(id)
	if msg == nil {
		t.Fatal("no message")
	}
	if _, ok := msg.Attributes["baggage"]; ok {
		t.Errorf("the message carries the caller's baggage: %v", msg.Attributes)
	}
	if msg.Attributes["traceparent"] == "" {
		t.Errorf("the message carries no traceparent: %v", msg.Attributes)
	}
}

// Push continues the message's trace in a consumer span named by the subscription's short name.
//
//nolint:paralleltest // it installs the global tracer provider (useRecorder)
func TestPushSpan(t *testing.T) {
	rec := useRecorder(t)
	_, root := otel.Tracer("test").Start(t.Context(), "submit")
	root.End()
	tp := "00-" + root.SpanContext().TraceID().String() + "-" + root.SpanContext().SpanID().String() + "-01"
	body := `{"message":{"messageId":"1","attributes":{"traceparent":"` + tp + `"}},"subscription":"projects/p/subscriptions/` + bus.SubResults + `"}`
	h := bus.Push(bus.HandlerFunc(func(context.Context, *bus.Message) bus.Result { return bus.Nack }), slog.New(slog.DiscardHandler))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/push", strings.NewReader(body)))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 for a nack", w.Code)
	}
	proc := ended(rec, "process "+bus.SubResults)
	if proc == nil || proc.Parent().SpanID() != root.SpanContext().SpanID() || proc.Status().Description != "nack" {
		t.Fatalf("consumer span %v, want a child of the message's span marked nack", proc)
	}
}
