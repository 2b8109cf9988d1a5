package httpapi

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
)

type metrics struct {
	ops     *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry, svc *service.Service) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "starlease_operations_total", Help: "Lease API operations by operation and result code.",
		}, []string{"operation", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "starlease_operation_duration_seconds", Help: "Lease API operation latency.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"operation"}),
	}
	health := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "starlease_backend_healthy", Help: "1 when the lease backend reports ok, else 0.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if svc.Health(ctx).Status == lease.HealthOK {
			return 1
		}
		return 0
	})
	reg.MustRegister(m.ops, m.latency, health)
	if counter, ok := svc.Store().(activeCounter); ok {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "starlease_active_leases",
			Help: "Active lease records in the backend (expired ones count until reclaimed).",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			n, err := counter.ActiveLeases(ctx)
			if err != nil {
				return -1
			}
			return float64(n)
		}))
	}
	if meter, ok := svc.Store().(lease.OutboxMeter); ok {
		reg.MustRegister(outboxCollector{meter})
	}
	return m
}

// outboxCollector exposes the fenced outbox's usage against its bounds,
// read once per scrape.
type outboxCollector struct{ meter lease.OutboxMeter }

var (
	outboxPendingDesc = prometheus.NewDesc("starlease_outbox_pending_entries",
		"Publications pending in the fenced outbox (-1: not measured).", nil, nil)
	outboxBytesDesc = prometheus.NewDesc("starlease_outbox_pending_bytes",
		"Bytes of bodies and headers of the pending publications (-1: not measured).", nil, nil)
	outboxMaxPendingDesc = prometheus.NewDesc("starlease_outbox_max_pending_entries",
		"Bound on pending publications (--outbox-max-pending); past it a publication is refused.", nil, nil)
	outboxMaxBytesDesc = prometheus.NewDesc("starlease_outbox_max_bytes",
		"Bound on the pending publications' bytes (--outbox-max-bytes); past it a publication is refused.", nil, nil)
	outboxFillDesc = prometheus.NewDesc("starlease_outbox_fill_ratio",
		"The larger of pending/max-pending and bytes/max-bytes: at 1 publications are refused (-1: not measured).", nil, nil)
)

func (c outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{outboxPendingDesc, outboxBytesDesc, outboxMaxPendingDesc, outboxMaxBytesDesc, outboxFillDesc} {
		ch <- d
	}
}

func (c outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	u, err := c.meter.OutboxUsage(ctx)
	pending, bytes, fill := float64(u.Pending), float64(u.Bytes), u.Fill()
	if err != nil {
		pending, bytes, fill = -1, -1, -1
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gauge(outboxPendingDesc, pending)
	gauge(outboxBytesDesc, bytes)
	gauge(outboxMaxPendingDesc, float64(u.MaxPending))
	gauge(outboxMaxBytesDesc, float64(u.MaxBytes))
	gauge(outboxFillDesc, fill)
}

// OutboxNearFull is the fill (lease.OutboxUsage.Fill) from which /readyz
// reports the outbox degraded: publications are still accepted, but a
// broker outage will soon have them refused.
const OutboxNearFull = 0.9

// outboxHealth is the /readyz component of the fenced outbox: degraded
// near and at its bounds (the lease API still serves; publications are
// refused only at the bound), or when its usage cannot be read.
func outboxHealth(meter lease.OutboxMeter) func(context.Context) ComponentHealth {
	return func(ctx context.Context) ComponentHealth {
		u, err := meter.OutboxUsage(ctx)
		if err != nil {
			return ComponentHealth{Status: "degraded", Reason: "outbox: its usage cannot be read"}
		}
		h := ComponentHealth{Status: "ok", Detail: map[string]any{"pending": u.Pending, "bytes": u.Bytes,
			"max_pending": u.MaxPending, "max_bytes": u.MaxBytes}}
		switch fill := u.Fill(); {
		case fill >= 1:
			h.Status, h.Reason = "degraded", "outbox: full; publications are refused until the relay drains it"
		case fill >= OutboxNearFull:
			h.Status, h.Reason = "degraded", fmt.Sprintf("outbox: %.0f%% of its bound; publications will be refused when it is full", 100*fill)
		}
		return h
	}
}

// activeCounter is a backend that can count its active leases cheaply.
type activeCounter interface {
	ActiveLeases(ctx context.Context) (int64, error)
}

func (m *metrics) observe(op string, code lease.Code, start time.Time) {
	m.ops.WithLabelValues(op, string(code)).Inc()
	m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
