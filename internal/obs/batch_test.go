package obs

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestBatchMetrics(t *testing.T) {
	t.Parallel()
	m, collect := metricsSetup(t)
	ctx := context.Background()
	m.BatchJobCreated(ctx, "flash", 400)
	m.BatchJobCreated(ctx, "flash", 100)
	unregister, err := m.ObserveBatchJobs(func() []BatchJobs {
		return []BatchJobs{{Model: "flash", Open: 2, OldestAge: 90 * time.Second, Deleting: 1}, {Model: "pro"}}
	})
	if err != nil {
		t.Fatal(err)
	}
	got := collect()
	equal(t, MetricBatchJobsOpen, points[int64](t, got[MetricBatchJobsOpen]), map[string]int64{"model=flash": 2, "model=pro": 0})
	equal(t, MetricBatchOldestAge, points[float64](t, got[MetricBatchOldestAge]), map[string]float64{"model=flash": 90, "model=pro": 0})
	equal(t, MetricBatchJobsDeleting, points[int64](t, got[MetricBatchJobsDeleting]), map[string]int64{"model=flash": 1, "model=pro": 0})
	d, ok := got[MetricBatchTasksPerJob].Data.(metricdata.Histogram[int64])
	if !ok || len(d.DataPoints) != 1 || d.DataPoints[0].Count != 2 || d.DataPoints[0].Sum != 500 {
		t.Errorf("%s = %+v, want two jobs of 500 tasks in all", MetricBatchTasksPerJob, got[MetricBatchTasksPerJob].Data)
	}
	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	var none *Metrics
	none.BatchJobCreated(ctx, "flash", 1)
	if _, err := none.ObserveBatchJobs(func() []BatchJobs { return nil }); err != nil {
		t.Errorf("nil Metrics: %v", err)
	}
}
