package obs

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/genbox-dev/genbox/pkg/task"
)

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{name: "local default", env: nil,
			want: Config{ServiceName: "worker", Exporter: ExportNone, LogLevel: slog.LevelInfo}},
		{name: "otlp endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
			want: Config{ServiceName: "worker", Exporter: ExportOTLP}},
		{name: "otlp traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"},
			want: Config{ServiceName: "worker", Exporter: ExportOTLP}},
		{name: "otlp metrics endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317"},
			want: Config{ServiceName: "worker", Exporter: ExportOTLP}},
		{name: "gcp", env: map[string]string{"GENBOX_TELEMETRY": "gcp", "GOOGLE_CLOUD_PROJECT": "p", "OTEL_SERVICE_NAME": "genbox-worker"},
			want: Config{ServiceName: "genbox-worker", Exporter: ExportGCP, Project: "p"}},
		{name: "explicit wins over endpoint", env: map[string]string{"GENBOX_TELEMETRY": "stdout", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"},
			want: Config{ServiceName: "worker", Exporter: ExportStdout}},
		{name: "log switches", env: map[string]string{"GENBOX_LOG_LEVEL": "debug", "GENBOX_LOG_CONTENT": "true"},
			want: Config{ServiceName: "worker", Exporter: ExportNone, LogLevel: slog.LevelDebug, LogContent: true}},
		{name: "gcp without project", env: map[string]string{"GENBOX_TELEMETRY": "gcp"}, wantErr: "GOOGLE_CLOUD_PROJECT"},
		{name: "unknown exporter", env: map[string]string{"GENBOX_TELEMETRY": "jaeger"}, wantErr: "GENBOX_TELEMETRY"},
		{name: "bad level", env: map[string]string{"GENBOX_LOG_LEVEL": "loud"}, wantErr: "GENBOX_LOG_LEVEL"},
		{name: "bad content switch", env: map[string]string{"GENBOX_LOG_CONTENT": "maybe"}, wantErr: "GENBOX_LOG_CONTENT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var asked []string
			c, err := ConfigFromEnv(func(k string) string { asked = append(asked, k); return tt.env[k] }, "worker")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c != tt.want {
				t.Errorf("config = %+v, want %+v", c, tt.want)
			}
			for _, k := range []string{"OTEL_SERVICE_NAME", "GENBOX_TELEMETRY", "GOOGLE_CLOUD_PROJECT", "GENBOX_LOG_LEVEL", "GENBOX_LOG_CONTENT",
				"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
				if !slices.Contains(asked, k) {
					t.Errorf("getenv not called for %s", k)
				}
			}
		})
	}
}

// resetGlobals leaves no-op global OpenTelemetry providers and an empty propagator after a test
// that installs its own. Such tests do not call t.Parallel.
func resetGlobals(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
}

//nolint:paralleltest // it sets the global OpenTelemetry providers
func TestSetupNoneInstallsPropagatorOnly(t *testing.T) {
	resetGlobals(t)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	tp := tracenoop.NewTracerProvider()
	otel.SetTracerProvider(tp)
	shutdown, err := Setup(context.Background(), Config{ServiceName: "worker", Exporter: ExportNone})
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("no-op shutdown: %v", err)
	}
	if otel.GetTracerProvider() != tp {
		t.Error("ExportNone replaced the tracer provider")
	}
	fields := otel.GetTextMapPropagator().Fields()
	for _, f := range []string{"traceparent", "tracestate", "baggage"} {
		if !slices.Contains(fields, f) {
			t.Errorf("global propagator fields %v lack %s", fields, f)
		}
	}
}

//nolint:paralleltest // it sets the global OpenTelemetry providers
func TestSetupRejectsInvalidConfig(t *testing.T) {
	resetGlobals(t)
	if _, err := Setup(context.Background(), Config{ServiceName: "w", Exporter: "zipkin"}); err == nil {
		t.Fatal("Setup accepted an unknown exporter")
	}
}

//nolint:paralleltest // it sets the global OpenTelemetry providers
func TestSetupStdoutExportsSpans(t *testing.T) {
	resetGlobals(t)
	var buf syncBuffer
	shutdown, err := Setup(context.Background(), Config{ServiceName: "worker", Exporter: ExportStdout, Stdout: &buf})
	if err != nil {
		t.Fatal(err)
	}
	_, span := Tracer().Start(context.Background(), "claim")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	out := buf.String()
	if !strings.Contains(out, `"Name":"claim"`) || !strings.Contains(out, `"worker"`) {
		t.Errorf("stdout export lacks the span or the service name:\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for the exporter's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// collector is an in-process OTLP gRPC receiver.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []string // span names
	service []string // service.name of each resource
	metrics []string // metric names
}

func (c *collector) Export(_ context.Context, r *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				c.service = append(c.service, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, s.Name)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	c *collector
}

func (m metricsService) Export(_ context.Context, r *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	for _, rm := range r.ResourceMetrics {
		for _, sm := range rm.ScopeMetrics {
			for _, mm := range sm.Metrics {
				m.c.metrics = append(m.c.metrics, mm.Name)
			}
		}
	}
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

//nolint:paralleltest // it sets the global OpenTelemetry providers and the process environment
func TestSetupOTLPExportsToCollector(t *testing.T) {
	resetGlobals(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	colmetricpb.RegisterMetricsServiceServer(srv, metricsService{c: c})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + lis.Addr().String(), "OTEL_SERVICE_NAME": "genbox-publisher"}
	for k, v := range env {
		t.Setenv(k, v) // the exporters read the process environment
	}
	cfg, err := ConfigFromEnv(func(k string) string { return env[k] }, "publisher")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	shutdown, err := Setup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(otel.GetMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	m.Retry(ctx, "transient")
	_, span := Tracer().Start(ctx, "publish")
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.spans, "publish") || !slices.Contains(c.service, "genbox-publisher") {
		t.Errorf("collector got spans %v from services %v, want publish from genbox-publisher", c.spans, c.service)
	}
	if !slices.Contains(c.metrics, MetricRetries) {
		t.Errorf("collector got metrics %v, want %s", c.metrics, MetricRetries)
	}
}

func TestSetupGCPNeedsCredentials(t *testing.T) {
	resetGlobals(t)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "missing.json"))
	_, err := Setup(context.Background(), Config{ServiceName: "worker", Exporter: ExportGCP, Project: "p"})
	if err == nil || !strings.Contains(err.Error(), "application default credentials") {
		t.Fatalf("err = %v, want a credentials error", err)
	}
}

// With Application Default Credentials (here a service-account key whose token endpoint is
// unreachable) the gcp pipeline builds without a network call, spans carry the project, and a
// flush that cannot reach telemetry.googleapis.com is reported by shutdown within its budget.
func TestSetupGCPWithCredentials(t *testing.T) {
	resetGlobals(t)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "p", "private_key_id": "1", "client_id": "1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})),
		"client_email": "worker@p.iam.gserviceaccount.com", "token_uri": "http://127.0.0.1:1/token",
	})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(file, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", file)
	shutdown, err := Setup(context.Background(), Config{ServiceName: "worker", Exporter: ExportGCP, Project: "p"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := Tracer().Start(context.Background(), "claim")
	ro, ok := span.(sdktrace.ReadOnlySpan)
	if !ok {
		t.Fatalf("span %T is not an SDK span", span)
	}
	span.End()
	got := map[string]string{}
	for _, kv := range ro.Resource().Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	if got["gcp.project_id"] != "p" || got["service.name"] != "worker" {
		t.Errorf("resource = %v, want gcp.project_id p and service.name worker", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := shutdown(ctx); err == nil {
		t.Error("shutdown reported no error for an export that cannot have succeeded")
	}
}

// One trace crosses services: an HTTP request into the publisher, a Pub/Sub message to the
// worker, another to the result handler. Each hop carries the W3C context the way the bus does
// (the global propagator injects into and extracts from the message attributes).
//
//nolint:paralleltest // it sets the global OpenTelemetry providers
func TestTraceCrossesHTTPAndPubSubAttributes(t *testing.T) {
	resetGlobals(t)
	if _, err := Setup(context.Background(), Config{ServiceName: "test", Exporter: ExportNone}); err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	var logs syncBuffer
	log := NewLogger(&logs, slog.LevelInfo, LogOptions{Project: "p"})

	publish := func(ctx context.Context, name string) map[string]string {
		ctx, span := Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer))
		defer span.End()
		attrs := map[string]string{"task_id": "t1"}
		otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(attrs))
		return attrs
	}
	consume := func(attrs map[string]string, name string) context.Context {
		ctx := otel.GetTextMapPropagator().Extract(context.Background(), propagation.MapCarrier(attrs))
		ctx, span := Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer))
		defer span.End()
		log.InfoContext(WithTask(ctx, attrs["task_id"]), name)
		return ctx
	}

	var toWorker map[string]string
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		toWorker = publish(r.Context(), "publish gemini-tasks")
		w.WriteHeader(http.StatusAccepted)
	}), "publisher"))
	defer srv.Close()

	// The client's span, sent as a traceparent header.
	cctx, client := Tracer().Start(context.Background(), "client")
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL+"/v1/tasks", nil)
	if err != nil {
		t.Fatal(err)
	}
	otel.GetTextMapPropagator().Inject(cctx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	client.End()
	if toWorker["traceparent"] == "" {
		t.Fatalf("message attributes %v carry no traceparent", toWorker)
	}
	wctx := consume(toWorker, "process gemini-tasks")
	consume(publish(wctx, "publish gemini-results"), "process gemini-results")

	spans := exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
		if s.SpanContext.TraceID() != client.SpanContext().TraceID() {
			t.Errorf("span %q is in trace %s, want %s", s.Name, s.SpanContext.TraceID(), client.SpanContext().TraceID())
		}
	}
	var server string
	for name, s := range byName {
		if s.SpanKind == trace.SpanKindServer {
			server = name
		}
	}
	if server == "" {
		t.Fatalf("no HTTP server span among %v", names(spans))
	}
	for child, parent := range map[string]string{
		server:                   "client",
		"publish gemini-tasks":   server,
		"process gemini-tasks":   "publish gemini-tasks",
		"publish gemini-results": "process gemini-tasks",
		"process gemini-results": "publish gemini-results",
	} {
		c, ok := byName[child]
		if !ok {
			t.Errorf("no span %q among %v", child, names(spans))
			continue
		}
		if c.Parent.SpanID() != byName[parent].SpanContext.SpanID() {
			t.Errorf("span %q has parent %s, want %q (%s)", child, c.Parent.SpanID(), parent, byName[parent].SpanContext.SpanID())
		}
	}
	// The consumers' log lines link to the same trace.
	want := "projects/p/traces/" + client.SpanContext().TraceID().String()
	if n := strings.Count(logs.String(), want); n != 2 {
		t.Errorf("%d log lines link to %s, want 2:\n%s", n, want, logs.String())
	}
}

//nolint:paralleltest // it sets the global OpenTelemetry providers
func TestHandlerSpanNamesAndProbes(t *testing.T) {
	resetGlobals(t)
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/tasks/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	h := Handler(mux, "publisher")
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodPost, "/v1/tasks/t1/cancel", nil),
		httptest.NewRequest(http.MethodGet, "/healthz", nil),
		httptest.NewRequest(http.MethodGet, "/nowhere", nil),
	} {
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	got := names(exp.GetSpans())
	want := []string{"publisher POST /v1/tasks/{id}/cancel", "publisher GET"}
	if !slices.Equal(got, want) {
		t.Errorf("spans = %q, want %q", got, want)
	}
}

// A public caller's trace headers do not make genbox's spans part of its trace: the server span
// starts a new trace, linked to the caller's span, and the caller's baggage never reaches the
// handler (nor, through it, a message).
func TestPublicHandlerLinksTheCallersTrace(t *testing.T) { //nolint:paralleltest // sets the global telemetry
	resetGlobals(t)
	if _, err := Setup(context.Background(), Config{ServiceName: "test", Exporter: ExportNone}); err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	var seen baggage.Baggage
	var inner trace.SpanContext
	h := PublicHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, inner = baggage.FromContext(r.Context()), trace.SpanContextFromContext(r.Context())
	}), "publisher")

	ctx, span := Tracer().Start(context.Background(), "caller")
	span.End()
	caller := trace.SpanContextFromContext(ctx)
	m, _ := baggage.NewMember("tenant", "someone-else")
	b, _ := baggage.New(m)
	ctx = baggage.ContextWithBaggage(ctx, b)
	req := httptest.NewRequest(http.MethodPost, "/v1/tasks", nil)
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	if req.Header.Get("baggage") == "" || req.Header.Get("traceparent") == "" {
		t.Fatalf("the caller's headers %v carry no traceparent or baggage", req.Header)
	}
	h.ServeHTTP(httptest.NewRecorder(), req)

	var server *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindServer {
			server = &s
		}
	}
	if server == nil {
		t.Fatalf("no server span among %v", names(exp.GetSpans()))
	}
	if server.SpanContext.TraceID() == caller.TraceID() || server.Parent.IsValid() {
		t.Errorf("server span in trace %s with parent %v: continues the caller's trace %s", server.SpanContext.TraceID(), server.Parent, caller.TraceID())
	}
	if len(server.Links) != 1 || server.Links[0].SpanContext.SpanID() != caller.SpanID() {
		t.Errorf("server span links %+v, want one link to the caller's span %s", server.Links, caller.SpanID())
	}
	if inner.TraceID() != server.SpanContext.TraceID() {
		t.Errorf("the handler runs in trace %s, not the server span's %s", inner.TraceID(), server.SpanContext.TraceID())
	}
	if seen.Len() != 0 {
		t.Errorf("the handler sees the caller's baggage %q", seen.String())
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

//nolint:paralleltest // it sets the global OpenTelemetry providers
func TestStartAndEndSpans(t *testing.T) {
	resetGlobals(t)
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	ctx := WithTask(context.Background(), "t7")

	_, ok := Start(ctx, "gemini.generate", GenerationAttrs("flash", 2, task.Usage{PromptTokens: 11, OutputTokens: 5})...)
	End(ok, nil, "")
	_, failed := Start(ctx, "gemini.generate", GenerationAttrs("pro", 3, task.Usage{})...)
	End(failed, errors.New("503 unavailable"), "transient")

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2", len(spans))
	}
	attrs := func(s tracetest.SpanStub) map[string]string {
		out := map[string]string{}
		for _, kv := range s.Attributes {
			out[string(kv.Key)] = kv.Value.String()
		}
		return out
	}
	a := attrs(spans[0])
	if a[SpanTaskID] != "t7" || a[SpanModel] != "flash" || a[SpanAttempt] != "2" || a[SpanInputTokens] != "11" || a[SpanOutputTokens] != "5" {
		t.Errorf("attempt span attributes = %v", a)
	}
	if spans[0].Status.Code != codes.Unset {
		t.Errorf("successful span status = %v", spans[0].Status)
	}
	if b := attrs(spans[1]); spans[1].Status.Code != codes.Error || b[SpanErrorType] != "transient" || len(spans[1].Events) != 1 {
		t.Errorf("failed span: status %v, attributes %v, events %v", spans[1].Status, b, spans[1].Events)
	}
}
