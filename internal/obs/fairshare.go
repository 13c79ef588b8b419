package obs

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Fair-share metric names: stable, as dashboards refer to them.
const (
	// MetricTenantRunning is a tenant's tasks holding a slot, as the worker last read its count.
	MetricTenantRunning = "genbox.tenant.running"
	// MetricTenantCap is the cap a tenant is held to: its concurrency, or its weighted share of
	// the pool when the pool is contended and that is lower.
	MetricTenantCap = "genbox.tenant.cap"
	// MetricTenantShare is a tenant's weighted share of the pool under contention; 0 when the
	// pool has room for what every tenant asks.
	MetricTenantShare = "genbox.tenant.share"
)

type shareInstruments struct {
	running, cap metric.Int64Gauge
	share        metric.Float64Gauge
}

func (m *Metrics) shares() (*shareInstruments, error) {
	m.shareOnce.Do(func() {
		s := &shareInstruments{}
		var err1, err2, err3 error
		s.running, err1 = m.meter.Int64Gauge(MetricTenantRunning, metric.WithUnit("{task}"),
			metric.WithDescription("A tenant's tasks holding one of its slots, across instances."))
		s.cap, err2 = m.meter.Int64Gauge(MetricTenantCap, metric.WithUnit("{task}"),
			metric.WithDescription("The cap a tenant is held to: its concurrency, or its weighted share of a contended pool."))
		s.share, err3 = m.meter.Float64Gauge(MetricTenantShare, metric.WithUnit("{task}"),
			metric.WithDescription("A tenant's weighted share of the worker pool's slots while tenants contend for them."))
		m.shareInst, m.shareErr = s, errors.Join(err1, err2, err3)
	})
	return m.shareInst, m.shareErr
}

// TenantShare records tenant's running tasks, the cap it is held to and its share of the pool,
// as a worker instance last divided the pool.
func (m *Metrics) TenantShare(ctx context.Context, tenant string, running, limit int, share float64) {
	if m == nil {
		return
	}
	s, err := m.shares()
	if err != nil {
		return
	}
	attrs := metric.WithAttributes(attribute.String(AttrTenant, tenant))
	s.running.Record(ctx, int64(running), attrs)
	s.cap.Record(ctx, int64(limit), attrs)
	s.share.Record(ctx, share, attrs)
}
