package httpapi

import (
	"context"
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
	return m
}

// activeCounter is a backend that can count its active leases cheaply.
type activeCounter interface {
	ActiveLeases(ctx context.Context) (int64, error)
}

func (m *metrics) observe(op string, code lease.Code, start time.Time) {
	m.ops.WithLabelValues(op, string(code)).Inc()
	m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
