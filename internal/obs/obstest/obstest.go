// Package obstest records genbox's telemetry in memory for tests: Install puts a span recorder
// and a metric ManualReader behind the global OpenTelemetry providers (as obs.Setup installs
// exporting ones) and gives the obs.Metrics to hand to services; Spans and Points read back what
// was recorded. Tests using Install change process-wide state: they must not run in parallel.
// Metrics gives a test's own metrics, read the same way and safe in parallel tests.
package obstest

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/genbox-dev/genbox/internal/obs"
)

// Telemetry is the in-memory telemetry of one test.
type Telemetry struct {
	// Metrics are the instruments to hand to the services under test.
	Metrics *obs.Metrics
	rec     *tracetest.SpanRecorder
	reader  *sdkmetric.ManualReader
}

// Install sets the global propagator (W3C TraceContext), tracer provider and meter provider to
// in-memory ones for the rest of the test, and restores the previous ones when it ends.
func Install(t testing.TB) *Telemetry {
	t.Helper()
	prevProp, prevTP, prevMP := otel.GetTextMapPropagator(), otel.GetTracerProvider(), otel.GetMeterProvider()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetTextMapPropagator(prevProp)
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	m, err := obs.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	return &Telemetry{Metrics: m, rec: rec, reader: reader}
}

// Metrics returns in-memory metrics of t's own, not installed globally: only what is handed its
// Metrics is recorded, so parallel tests do not see each other's. views shape its streams (an
// exponential histogram for a benchmark's quantiles). It records no spans.
func Metrics(t testing.TB, views ...sdkmetric.View) *Telemetry {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithView(views...))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := obs.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	return &Telemetry{Metrics: m, rec: tracetest.NewSpanRecorder(), reader: reader}
}

// Spans returns the spans ended so far.
func (tel *Telemetry) Spans() []sdktrace.ReadOnlySpan { return tel.rec.Ended() }

// Trace returns the ended spans of trace id.
func (tel *Telemetry) Trace(id trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tel.rec.Ended() {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// TaskSpans returns the ended spans tagged with task id (obs.SpanTaskID).
func (tel *Telemetry) TaskSpans(id string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tel.rec.Ended() {
		if v, ok := Attr(s, obs.SpanTaskID); ok && v.AsString() == id {
			out = append(out, s)
		}
	}
	return out
}

// Attr returns the value of span attribute key.
func Attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// Names returns the names of spans, in order.
func Names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

// Point is one data point: its attributes ("k=v,k=v", sorted by key), and its value (sums and
// gauges) or count and sum (histograms).
type Point struct {
	Attrs string
	Value float64
	Count uint64
}

// collect collects the metrics and returns those named name.
func (tel *Telemetry) collect(t testing.TB, name string) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			if mm.Name == name {
				out = append(out, mm)
			}
		}
	}
	return out
}

// Points collects the metrics and returns the data points of the metric named name.
func (tel *Telemetry) Points(t testing.TB, name string) []Point {
	t.Helper()
	var out []Point
	for _, mm := range tel.collect(t, name) {
		out = append(out, points(mm)...)
	}
	slices.SortFunc(out, func(a, b Point) int { return strings.Compare(a.Attrs, b.Attrs) })
	return out
}

// Quantile returns the q-quantile (0..1) of the exponential histogram name (every point
// together): the upper bound of the bucket holding that rank, within the histogram's relative
// precision. It fails t when name is not an exponential histogram or has no values.
func (tel *Telemetry) Quantile(t testing.TB, name string, q float64) float64 {
	t.Helper()
	counts := map[int32]uint64{} // by bucket index at the coarsest scale
	var total uint64
	scale := int32(math.MaxInt32)
	var pts []metricdata.ExponentialHistogramDataPoint[float64]
	for _, mm := range tel.collect(t, name) {
		d, ok := mm.Data.(metricdata.ExponentialHistogram[float64])
		if !ok {
			t.Fatalf("%s is a %T, not an exponential histogram", name, mm.Data)
		}
		for _, p := range d.DataPoints {
			pts = append(pts, p)
			scale = min(scale, p.Scale)
		}
	}
	for _, p := range pts {
		for k, c := range p.PositiveBucket.Counts {
			counts[(p.PositiveBucket.Offset+int32(k))>>(p.Scale-scale)] += c
			total += c
		}
	}
	if total == 0 {
		t.Fatalf("%s has no positive values", name)
	}
	rank := uint64(math.Ceil(q * float64(total)))
	idx := slices.Sorted(maps.Keys(counts))
	var seen uint64
	for _, i := range idx {
		if seen += counts[i]; seen >= rank {
			return math.Exp2(float64(i+1) / math.Exp2(float64(scale)))
		}
	}
	return math.Exp2(float64(idx[len(idx)-1]+1) / math.Exp2(float64(scale)))
}

// Sum adds the values (counts, for histograms) of the points of name whose attributes include
// every "k=v" of match.
func (tel *Telemetry) Sum(t testing.TB, name string, match ...string) float64 {
	t.Helper()
	var total float64
	for _, p := range tel.Points(t, name) {
		if p.matches(match) {
			if p.Count > 0 {
				total += float64(p.Count)
			} else {
				total += p.Value
			}
		}
	}
	return total
}

func (p Point) matches(match []string) bool {
	parts := strings.Split(p.Attrs, ",")
	for _, m := range match {
		if !slices.Contains(parts, m) {
			return false
		}
	}
	return true
}

func points(mm metricdata.Metrics) []Point {
	var out []Point
	switch d := mm.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, Point{Attrs: key(p.Attributes), Value: float64(p.Value)})
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			out = append(out, Point{Attrs: key(p.Attributes), Value: p.Value})
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, Point{Attrs: key(p.Attributes), Value: float64(p.Value)})
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out = append(out, Point{Attrs: key(p.Attributes), Value: p.Value})
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, Point{Attrs: key(p.Attributes), Value: p.Sum, Count: p.Count})
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			out = append(out, Point{Attrs: key(p.Attributes), Value: float64(p.Sum), Count: p.Count})
		}
	}
	return out
}

func key(s attribute.Set) string {
	kvs := s.ToSlice()
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = string(kv.Key) + "=" + kv.Value.String()
	}
	return strings.Join(parts, ",")
}

// Buffer is a goroutine-safe log sink: hand it to obs.NewLogger and read the lines back.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines returns the lines written so far that contain every one of subs.
func (b *Buffer) Lines(subs ...string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		ok := l != ""
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// String renders a point for failure messages.
func (p Point) String() string {
	if p.Count > 0 {
		return fmt.Sprintf("{%s} count %d sum %g", p.Attrs, p.Count, p.Value)
	}
	return fmt.Sprintf("{%s} %g", p.Attrs, p.Value)
}
