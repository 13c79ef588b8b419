package obs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Batch job metric names: stable, as dashboards refer to them.
const (
	MetricBatchJobsOpen     = "genbox.batch.jobs_open"
	MetricBatchOldestAge    = "genbox.batch.oldest_age"
	MetricBatchTasksPerJob  = "genbox.batch.tasks_per_job"
	MetricBatchJobsDeleting = "genbox.batch.jobs_deleting"
)

// BatchJobs is what a model's batcher knows of its open jobs.
type BatchJobs struct {
	Model string
	Open  int64
	// OldestAge is the age of the oldest open job (0 when none is open).
	OldestAge time.Duration
	// Deleting counts the settled jobs not yet deleted at Gemini (not in Open): each holds its
	// tasks' inputs and outputs there until its delete succeeds.
	Deleting int64
}

// batchInstruments are created on first use, so that Metrics built by NewMetrics need not know
// them.
type batchInstruments struct {
	open      metric.Int64ObservableGauge
	oldestAge metric.Float64ObservableGauge
	deleting  metric.Int64ObservableGauge
	tasks     metric.Int64Histogram
}

func (m *Metrics) batch() (*batchInstruments, error) {
	m.batchOnce.Do(func() {
		b := &batchInstruments{}
		var err1, err2, err3, err4 error
		b.open, err1 = m.meter.Int64ObservableGauge(MetricBatchJobsOpen, metric.WithUnit("{job}"),
			metric.WithDescription("Batch jobs not yet settled, by model."))
		b.oldestAge, err2 = m.meter.Float64ObservableGauge(MetricBatchOldestAge, metric.WithUnit("s"),
			metric.WithDescription("Age of the oldest batch job not yet settled, by model."))
		b.deleting, err4 = m.meter.Int64ObservableGauge(MetricBatchJobsDeleting, metric.WithUnit("{job}"),
			metric.WithDescription("Settled batch jobs whose delete at Gemini has not succeeded yet, by model."))
		b.tasks, err3 = m.meter.Int64Histogram(MetricBatchTasksPerJob, metric.WithUnit("{task}"),
			metric.WithDescription("Tasks in each batch job created, by model."),
			metric.WithExplicitBucketBoundaries(1, 5, 10, 25, 50, 100, 200, 300, 400, 500))
		m.batchInst, m.batchErr = b, errors.Join(err1, err2, err3, err4)
	})
	return m.batchInst, m.batchErr
}

// BatchJobCreated records a batch job of tasks created for model.
func (m *Metrics) BatchJobCreated(ctx context.Context, model string, tasks int) {
	if m == nil {
		return
	}
	if b, err := m.batch(); err == nil {
		b.tasks.Record(ctx, int64(tasks), metric.WithAttributes(attribute.String(AttrModel, model)))
	}
}

// ObserveBatchJobs feeds genbox.batch.jobs_open, genbox.batch.oldest_age and
// genbox.batch.jobs_deleting from jobs, called at each collection. The batcher provides it and
// calls unregister when it stops.
func (m *Metrics) ObserveBatchJobs(jobs func() []BatchJobs) (unregister func() error, err error) {
	if m == nil {
		return func() error { return nil }, nil
	}
	b, err := m.batch()
	if err != nil {
		return nil, err
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, j := range jobs() {
			attrs := metric.WithAttributes(attribute.String(AttrModel, j.Model))
			o.ObserveInt64(b.open, j.Open, attrs)
			o.ObserveFloat64(b.oldestAge, j.OldestAge.Seconds(), attrs)
			o.ObserveInt64(b.deleting, j.Deleting, attrs)
		}
		return nil
	}, b.open, b.oldestAge, b.deleting)
	if err != nil {
		return nil, fmt.Errorf("register batch gauges: %w", err)
	}
	return reg.Unregister, nil
}
