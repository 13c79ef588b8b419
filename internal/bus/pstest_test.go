package bus_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/genbox-dev/genbox/internal/bus"
)

// fake is an in-process pstest server with genbox's topology and a client on it.
type fake struct {
	srv *pstest.Server
	c   *pubsub.Client
	p   *bus.Publisher
}

func setupFake(t *testing.T) *fake {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pubsub.NewClient(t.Context(), "p", option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := bus.Bootstrap(t.Context(), c, bus.DefaultTopology()); err != nil {
		t.Fatal(err)
	}
	p := bus.NewPublisher(c)
	t.Cleanup(func() { _ = p.Close() })
	return &fake{srv: srv, c: c, p: p}
}

// pstestPull is the pull setting pstest needs to deliver promptly.
var pstestPull = bus.PullSettings{NumGoroutines: 8, MaxOutstandingMessages: 10}

// pull runs Pull until the test ends or stop is called, and fails the test if Pull errs.
func (f *fake) pull(t *testing.T, sub string, h bus.Handler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := bus.Pull(ctx, f.c, sub, pstestPull, h); err != nil {
			t.Errorf("pull: %v", err)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// Not parallel: it sets the global propagator, as a service's telemetry setup does.
//
//nolint:paralleltest // it sets the global propagator
func TestTraceContextCrossesPubSub(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	f := setupFake(t)
	got := make(chan trace.SpanContext, 1)
	f.pull(t, bus.SubWorker, bus.HandlerFunc(func(ctx context.Context, _ *bus.Message) bus.Result {
		got <- trace.SpanContextFromContext(ctx)
		return bus.Ack
	}))

	ctx, span := tp.Tracer("test").Start(t.Context(), "submit")
	defer span.End()
	attrs := map[string]string{"task_id": "t1"}
	id, err := f.p.Publish(ctx, bus.TopicTasks, []byte("x"), attrs)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(attrs, map[string]string{"task_id": "t1"}) {
		t.Errorf("Publish changed the caller's attributes: %v", attrs)
	}
	if m := f.srv.Message(id); m == nil || m.Attributes["traceparent"] == "" || m.Attributes["task_id"] != "t1" {
		t.Fatalf("published message lacks traceparent or task_id: %+v", m)
	}
	select {
	case sc := <-got:
		want := span.SpanContext()
		if sc.TraceID() != want.TraceID() || sc.SpanID() != want.SpanID() || !sc.IsRemote() {
			t.Errorf("handler span context %v/%v remote=%v, want %v/%v remote", sc.TraceID(), sc.SpanID(), sc.IsRemote(), want.TraceID(), want.SpanID())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("message never handled")
	}
}

func TestPullAckNack(t *testing.T) {
	t.Parallel()
	f := setupFake(t)
	var mu sync.Mutex
	seen := map[string]int{}
	acked := make(chan string, 10)
	stop := f.pull(t, bus.SubResults, bus.HandlerFunc(func(_ context.Context, m *bus.Message) bus.Result {
		mu.Lock()
		defer mu.Unlock()
		seen[m.ID]++
		if seen[m.ID] == 1 && string(m.Data) == "nack first" {
			return bus.Nack
		}
		acked <- m.ID
		return bus.Ack
	}))
	ids := map[string]string{}
	for _, data := range []string{"ack", "nack first"} {
		id, err := f.p.Publish(t.Context(), bus.TopicResults, []byte(data), nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[data] = id
	}
	for range 2 {
		select {
		case <-acked:
		case <-time.After(30 * time.Second):
			t.Fatal("messages not acked")
		}
	}
	stop() // Pull returns nil once its context ends
	mu.Lock()
	defer mu.Unlock()
	if n := seen[ids["ack"]]; n != 1 {
		t.Errorf("acked message handled %d times, want 1", n)
	}
	if n := seen[ids["nack first"]]; n != 2 {
		t.Errorf("nacked message handled %d times, want 2 (nack, then redelivery)", n)
	}
	for data, id := range ids {
		if m := f.srv.Message(id); m.Acks != 1 {
			t.Errorf("%q: %d acks on the server, want 1", data, m.Acks)
		}
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	f := setupFake(t)
	if _, err := f.p.Publish(t.Context(), bus.TopicAlerts, []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.p.Publish(t.Context(), bus.TopicAlerts, []byte("b"), nil); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("publish after close: %v, want ErrClosed", err)
	}
}

func TestPublishUnknownTopic(t *testing.T) {
	t.Parallel()
	f := setupFake(t)
	if _, err := f.p.Publish(t.Context(), "no-such-topic", []byte("a"), nil); err == nil {
		t.Error("publish to a missing topic succeeded")
	}
}

func TestTopologyValidate(t *testing.T) {
	t.Parallel()
	ok := bus.DefaultTopology()
	tests := []struct {
		name    string
		edit    func(*bus.Topology)
		wantErr bool
	}{
		{"default", func(*bus.Topology) {}, false},
		{"push to a known subscription", func(t *bus.Topology) { t.PushEndpoints = map[string]string{bus.SubAlerts: "https://x"} }, false},
		{"ack deadline too short", func(t *bus.Topology) { t.AckDeadline = 5 * time.Second }, true},
		{"ack deadline too long", func(t *bus.Topology) { t.AckDeadline = 11 * time.Minute }, true},
		{"too few delivery attempts", func(t *bus.Topology) { t.MaxDeliveryAttempts = 4 }, true},
		{"too many delivery attempts", func(t *bus.Topology) { t.MaxDeliveryAttempts = 101 }, true},
		{"backoff inverted", func(t *bus.Topology) { t.MinBackoff, t.MaxBackoff = time.Minute, time.Second }, true},
		{"backoff too long", func(t *bus.Topology) { t.MaxBackoff = 11 * time.Minute }, true},
		{"push to an unknown subscription", func(t *bus.Topology) { t.PushEndpoints = map[string]string{"nope": "https://x"} }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			topo := ok
			tt.edit(&topo)
			err := topo.Validate()
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, bus.ErrTopology)) {
				t.Errorf("Validate() = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
}
