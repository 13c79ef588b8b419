package obstest_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/genbox-dev/genbox/internal/obs"
	"github.com/genbox-dev/genbox/internal/obs/obstest"
)

// Metrics are a test's own: two of them do not see each other's values. Quantile reads an
// exponential histogram within its relative precision (160 buckets over less than an octave:
// better than 1%).
func TestMetricsQuantile(t *testing.T) {
	t.Parallel()
	view := sdkmetric.NewView(sdkmetric.Instrument{Name: obs.MetricPaidWindow},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationBase2ExponentialHistogram{MaxSize: 160, MaxScale: 20}})
	a, b := obstest.Metrics(t, view), obstest.Metrics(t)
	ctx := context.Background()
	for i := range 100 {
		a.Metrics.PaidWindow(ctx, time.Duration(500+i)*time.Millisecond) // 0.500 s .. 0.599 s
	}
	b.Metrics.WorkerOutcome(ctx, obs.WorkerStored)
	for _, tc := range []struct{ q, want float64 }{{0.5, 0.549}, {0.99, 0.598}, {1, 0.599}} {
		if got := a.Quantile(t, obs.MetricPaidWindow, tc.q); got < tc.want || got > tc.want*1.01 {
			t.Errorf("q%v = %v, want %v within 1%% above", tc.q, got, tc.want)
		}
	}
	if n := a.Sum(t, obs.MetricWorkerOutcomes); n != 0 {
		t.Errorf("a sees %v outcomes of b", n)
	}
	if n := b.Sum(t, obs.MetricWorkerOutcomes, "outcome=stored"); n != 1 {
		t.Errorf("b: %v stored, want 1", n)
	}
}
