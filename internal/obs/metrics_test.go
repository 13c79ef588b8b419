package obs

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/genbox-dev/genbox/pkg/task"
)

// metricsSetup returns Metrics on a provider read by a ManualReader, and a collect function.
func metricsSetup(t *testing.T) (*Metrics, func() map[string]metricdata.Metrics) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	return m, func() map[string]metricdata.Metrics {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		out := map[string]metricdata.Metrics{}
		for _, sm := range rm.ScopeMetrics {
			if sm.Scope.Name != InstrumentationName {
				t.Errorf("scope %q, want %q", sm.Scope.Name, InstrumentationName)
			}
			for _, mm := range sm.Metrics {
				out[mm.Name] = mm
			}
		}
		return out
	}
}

// key renders a data point's attributes as "k=v,k=v" (sorted by key, as attribute sets are).
func key(s attribute.Set) string {
	var out string
	for _, kv := range s.ToSlice() {
		if out != "" {
			out += ","
		}
		out += string(kv.Key) + "=" + kv.Value.String()
	}
	return out
}

// points returns the values of a sum or gauge by attribute key.
func points[N int64 | float64](t *testing.T, mm metricdata.Metrics) map[string]N {
	t.Helper()
	out := map[string]N{}
	switch d := mm.Data.(type) {
	case metricdata.Sum[N]:
		if !d.IsMonotonic {
			t.Errorf("%s is not monotonic", mm.Name)
		}
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = p.Value
		}
	case metricdata.Gauge[N]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = p.Value
		}
	default:
		t.Fatalf("%s: unexpected data %T", mm.Name, mm.Data)
	}
	return out
}

// histogram returns count and sum of a histogram by attribute key.
func histogram(t *testing.T, mm metricdata.Metrics) map[string][2]float64 {
	t.Helper()
	d, ok := mm.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s: unexpected data %T", mm.Name, mm.Data)
	}
	out := map[string][2]float64{}
	for _, p := range d.DataPoints {
		out[key(p.Attributes)] = [2]float64{float64(p.Count), p.Sum}
	}
	return out
}

func equal[V comparable](t *testing.T, name string, got, want map[string]V) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s = %v, want %v", name, got, want)
		return
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s[%s] = %v, want %v (all: %v)", name, k, g, w, got)
		}
	}
}

func TestMetricsRecordNamesAttributesValues(t *testing.T) {
	t.Parallel()
	m, collect := metricsSetup(t)
	ctx := context.Background()

	m.TaskState(ctx, "summary", task.StateQueued)
	m.TaskState(ctx, "summary", task.StateQueued)
	m.TaskState(ctx, "summary", task.StateRunning)
	m.TaskFinished(ctx, "summary", task.StateSucceeded, 3*time.Second)
	m.TaskFinished(ctx, "summary", task.StateSucceeded, 5*time.Second)
	m.TaskFinished(ctx, "tags", task.StateFailed, 0)
	m.Generation(ctx, "flash", "acme", task.Usage{PromptTokens: 100, OutputTokens: 40, TotalTokens: 140}, 0.25, 2*time.Second)
	m.Generation(ctx, "flash", "acme", task.Usage{PromptTokens: 10, OutputTokens: 5, TotalTokens: 15}, 0.5, 1*time.Second)
	m.Generation(ctx, "pro", "beta", task.Usage{PromptTokens: 7}, 0.125, 0)
	m.CacheHit(ctx, "summary")
	m.Retry(ctx, "transient")
	m.Retry(ctx, "transient")
	m.Retry(ctx, "network")
	m.Breaker(ctx, "flash", "open")
	m.Breaker(ctx, "pro", "half_open")
	m.Breaker(ctx, "pro", "closed")
	m.Breaker(ctx, "pro", "bogus")
	m.DeadLettersOpen(ctx, task.StageGeneration, 3)
	m.DeadLettersOpen(ctx, task.StageDelivery, 1)
	m.DeadLettersOpen(ctx, task.StageGeneration, 2)
	m.WebhookAttempt(ctx, "delivered", 100*time.Millisecond)
	m.WebhookAttempt(ctx, "failed", 300*time.Millisecond)
	m.WebhookAttempt(ctx, "delivered", 200*time.Millisecond)
	m.TenantSlot(ctx, "acme", SlotTaken)
	m.TenantSlot(ctx, "acme", SlotWaiting)
	m.TenantSlot(ctx, "acme", SlotWaiting)
	m.TenantSlot(ctx, "acme", SlotHandedOff)
	m.TenantSlot(ctx, "beta", SlotFreed)
	var age atomic.Int64
	age.Store(int64(90 * time.Second))
	unregister, err := m.ObservePendingAge(func(context.Context) (time.Duration, bool) {
		a := time.Duration(age.Load())
		return a, a > 0
	})
	if err != nil {
		t.Fatal(err)
	}

	got := collect()
	equal(t, MetricTasks, points[int64](t, got[MetricTasks]), map[string]int64{
		"family=summary,state=queued":    2,
		"family=summary,state=running":   1,
		"family=summary,state=succeeded": 2,
		"family=tags,state=failed":       1,
	})
	equal(t, MetricTaskE2ELatency, histogram(t, got[MetricTaskE2ELatency]), map[string][2]float64{
		"family=summary,state=succeeded": {2, 8},
	})
	equal(t, MetricTokens, points[int64](t, got[MetricTokens]), map[string]int64{
		"kind=prompt,model=flash,tenant=acme": 110,
		"kind=output,model=flash,tenant=acme": 45,
		"kind=prompt,model=pro,tenant=beta":   7,
	})
	equal(t, MetricCost, points[float64](t, got[MetricCost]), map[string]float64{
		"model=flash,tenant=acme": 0.75,
		"model=pro,tenant=beta":   0.125,
	})
	equal(t, MetricGenLatency, histogram(t, got[MetricGenLatency]), map[string][2]float64{
		"model=flash": {2, 3},
	})
	equal(t, MetricCacheHits, points[int64](t, got[MetricCacheHits]), map[string]int64{"family=summary": 1})
	equal(t, MetricRetries, points[int64](t, got[MetricRetries]), map[string]int64{"class=transient": 2, "class=network": 1})
	equal(t, MetricBreakerState, points[int64](t, got[MetricBreakerState]), map[string]int64{"model=flash": 2, "model=pro": 0})
	equal(t, MetricDeadLettersOpen, points[int64](t, got[MetricDeadLettersOpen]), map[string]int64{"stage=generation": 2, "stage=delivery": 1})
	equal(t, MetricWebhookAttempts, points[int64](t, got[MetricWebhookAttempts]), map[string]int64{"outcome=delivered": 2, "outcome=failed": 1})
	equal(t, MetricTenantSlots, points[int64](t, got[MetricTenantSlots]), map[string]int64{
		"event=taken,tenant=acme": 1, "event=waiting,tenant=acme": 2, "event=handed_off,tenant=acme": 1, "event=freed,tenant=beta": 1,
	})
	wl := histogram(t, got[MetricWebhookLatency])
	if d := wl["outcome=delivered"]; d[0] != 2 || math.Abs(d[1]-0.3) > 1e-9 {
		t.Errorf("%s delivered = %v, want count 2 sum 0.3", MetricWebhookLatency, d)
	}
	equal(t, MetricPendingAge, points[float64](t, got[MetricPendingAge]), map[string]float64{"": 90})

	// Nothing pending: no point. Unregistered: the callback is no longer called.
	age.Store(0)
	if _, ok := collect()[MetricPendingAge]; ok {
		t.Errorf("%s reported with nothing pending", MetricPendingAge)
	}
	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	age.Store(int64(time.Minute))
	if _, ok := collect()[MetricPendingAge]; ok {
		t.Errorf("%s reported after unregister", MetricPendingAge)
	}
}

func TestMetricsUnits(t *testing.T) {
	t.Parallel()
	m, collect := metricsSetup(t)
	ctx := context.Background()
	m.TaskFinished(ctx, "f", task.StateSucceeded, time.Second)
	m.Generation(ctx, "m", "t", task.Usage{PromptTokens: 1}, 1, time.Second)
	m.WebhookAttempt(ctx, "delivered", time.Second)
	got := collect()
	for name, unit := range map[string]string{MetricTaskE2ELatency: "s", MetricGenLatency: "s", MetricWebhookLatency: "s", MetricCost: "USD"} {
		if got[name].Unit != unit {
			t.Errorf("%s unit = %q, want %q", name, got[name].Unit, unit)
		}
	}
}

// A nil *Metrics does nothing, so a service without metrics calls the same code.
func TestMetricsNilSafe(t *testing.T) {
	t.Parallel()
	var m *Metrics
	ctx := context.Background()
	m.TaskState(ctx, "f", task.StateQueued)
	m.TaskFinished(ctx, "f", task.StateSucceeded, time.Second)
	m.Generation(ctx, "m", "t", task.Usage{PromptTokens: 1}, 1, time.Second)
	m.CacheHit(ctx, "f")
	m.TenantSlot(ctx, "t", SlotTaken)
	m.Retry(ctx, "transient")
	m.Breaker(ctx, "m", "open")
	m.DeadLettersOpen(ctx, task.StageDelivery, 1)
	m.WebhookAttempt(ctx, "delivered", time.Second)
	unregister, err := m.ObservePendingAge(func(context.Context) (time.Duration, bool) { return 0, false })
	if err != nil || unregister() != nil {
		t.Fatalf("nil ObservePendingAge: %v", err)
	}
}

// The worker's outcomes are counted by outcome and its paid windows recorded in seconds; a nil
// *Metrics records nothing.
func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	m, collect := metricsSetup(t)
	ctx := context.Background()
	m.WorkerOutcome(ctx, WorkerClaimed)
	m.WorkerOutcome(ctx, WorkerClaimed)
	m.WorkerOutcome(ctx, WorkerLost)
	m.PaidWindow(ctx, 500*time.Millisecond)
	m.PaidWindow(ctx, 1500*time.Millisecond)
	got := collect()
	equal(t, MetricWorkerOutcomes, points[int64](t, got[MetricWorkerOutcomes]), map[string]int64{"outcome=claimed": 2, "outcome=lost": 1})
	equal(t, MetricPaidWindow, histogram(t, got[MetricPaidWindow]), map[string][2]float64{"": {2, 2}})
	if u := got[MetricPaidWindow].Unit; u != "s" {
		t.Errorf("%s unit = %q, want s", MetricPaidWindow, u)
	}

	var none *Metrics
	none.WorkerOutcome(ctx, WorkerStored)
	none.PaidWindow(ctx, time.Second)
}
