package obs

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Worker metric names: stable, as dashboards refer to them.
const (
	MetricWorkerOutcomes = "genbox.worker.outcomes"
	MetricPaidWindow     = "genbox.worker.paid_window"
)

// Outcomes of genbox.worker.outcomes: what a worker did with a task it was nudged about. An
// output served from the response cache is counted in genbox.cache.hits, a flex call shed in
// genbox.retries (class shed).
const (
	WorkerClaimed    = "claimed"     // claimed: the run starts
	WorkerNotClaimed = "not_claimed" // already in hand here, not claimable, or the claim failed
	WorkerStored     = "stored"      // its output committed
	WorkerLost       = "lost"        // its output refused, or its call cancelled: another holder stored first
	WorkerReleased   = "released"    // handed back to the queue for a later attempt
	WorkerRefused    = "refused"     // a change refused: the lease was no longer this worker's
	WorkerParked     = "parked"      // every model unavailable: waiting
	WorkerFailed     = "failed"      // failed (a permanent error, or run_before passed)
	WorkerDead       = "dead"        // out of attempts or claims
	WorkerDeferred   = "deferred"    // handed back before a call (tenant cap, unreadable limits)
	WorkerStale      = "stale"       // output stored from a stale answer, without a call
)

// workerInstruments are created on first use, so that Metrics built by NewMetrics need not know
// them.
type workerInstruments struct {
	outcomes   metric.Int64Counter
	paidWindow metric.Float64Histogram
}

func (m *Metrics) worker() (*workerInstruments, error) {
	m.workerOnce.Do(func() {
		w := &workerInstruments{}
		var err1, err2 error
		w.outcomes, err1 = m.meter.Int64Counter(MetricWorkerOutcomes, metric.WithUnit("{task}"),
			metric.WithDescription("What the worker did with the tasks it was nudged about, by outcome."))
		w.paidWindow, err2 = m.meter.Float64Histogram(MetricPaidWindow, metric.WithUnit("s"),
			metric.WithDescription("From the start of a stored output's model call to its commit: the only window in which a crash costs a second generation."),
			metric.WithExplicitBucketBoundaries(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300))
		m.workerInst, m.workerErr = w, errors.Join(err1, err2)
	})
	return m.workerInst, m.workerErr
}

// WorkerOutcome counts one outcome (Worker*) of a task in the worker.
func (m *Metrics) WorkerOutcome(ctx context.Context, outcome string) {
	if m == nil {
		return
	}
	if w, err := m.worker(); err == nil {
		w.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrOutcome, outcome)))
	}
}

// PaidWindow records the paid window of an output stored: from the start of its model call to
// its commit.
func (m *Metrics) PaidWindow(ctx context.Context, d time.Duration) {
	if m == nil {
		return
	}
	if w, err := m.worker(); err == nil {
		w.paidWindow.Record(ctx, d.Seconds())
	}
}
