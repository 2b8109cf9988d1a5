package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/httpapi"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// maxURLFileBytes bounds the AMQP URL file.
const maxURLFileBytes = 4096

// loadURLFile reads the AMQP URL (which carries the broker password) from
// path with the pepper file's checks (auth.ReadSecretFile): an existing
// regular file (a symbolic link to one is followed) granting nothing to
// group or others, checked on the open descriptor. One trailing newline is
// dropped. Errors never show the URL.
func loadURLFile(path string) (string, error) {
	b, err := auth.ReadSecretFile(path, "rabbitmq URL file", maxURLFileBytes)
	if err != nil {
		return "", err
	}
	u := string(b)
	if strings.ContainsAny(u, "\r\n") || u == "" {
		return "", errors.New("rabbitmq URL file must hold one amqp:// or amqps:// URL on one line")
	}
	if _, err := amqp.ParseURI(u); err != nil {
		return "", errors.New("rabbitmq URL file does not hold a valid amqp:// or amqps:// URL")
	}
	return u, nil
}

// relayFlags configure the outbox relay of serve.
type relayFlags struct {
	urlFile              string
	ttl, staleAfter      time.Duration
	confirmTimeout, poll time.Duration
	mandatory            bool
}

func (f *relayFlags) register(fsf interface {
	StringVar(*string, string, string, string)
	DurationVar(*time.Duration, string, time.Duration, string)
	BoolVar(*bool, string, bool, string)
}) {
	fsf.StringVar(&f.urlFile, "rabbitmq-url-file", "", "run the outbox relay: file (mode 0600) holding the amqp:// or amqps:// URL of the broker fenced publications go to")
	fsf.DurationVar(&f.ttl, "relay-lease-ttl", rabbitmq.DefaultRelayLeaseTTL, "relay: TTL of the lease on the outbox that lets one server's relay publish at a time (a standby takes over within about this)")
	fsf.DurationVar(&f.staleAfter, "relay-stale-after", rabbitmq.DefaultStaleAfter, "relay: /readyz is degraded when the oldest pending publication is older than this")
	fsf.DurationVar(&f.confirmTimeout, "relay-confirm-timeout", 0, "relay: bound on publishing a batch and on its confirms (default: the smaller of 10s and a quarter of --relay-lease-ttl)")
	fsf.DurationVar(&f.poll, "relay-poll-interval", rabbitmq.DefaultPollInterval, "relay: how often an empty outbox is read again")
	fsf.BoolVar(&f.mandatory, "relay-mandatory", false, "relay: publish with the mandatory flag (an unroutable publication stays in the outbox)")
}

// outboxName names a backend's outbox in the relay's lock identity.
func outboxName(f backendFlags) string {
	switch f.backend {
	case "valkey":
		return "valkey." + f.valkeyPrefix
	case "etcd":
		// Servers on one cluster and prefix share the outbox, so they
		// share its relay lease.
		return "etcd." + f.etcdPrefix
	}
	return "bolt"
}

// startRelay starts the leased outbox relay if --rabbitmq-url-file is set;
// it returns the /readyz component and a stop function that waits for the
// relay to settle its batch and release its lease (call it before the store
// closes).
func startRelay(ctx context.Context, rf relayFlags, bf backendFlags, store lease.Store, reg *prometheus.Registry, log *slog.Logger) (map[string]func(context.Context) httpapi.ComponentHealth, func(), error) {
	if rf.urlFile == "" {
		return nil, func() {}, nil
	}
	url, err := loadURLFile(rf.urlFile)
	if err != nil {
		return nil, nil, err
	}
	box, ok := store.(lease.Outbox)
	if !ok {
		return nil, nil, errors.New("--rabbitmq-url-file: this backend has no fenced outbox")
	}
	id := rabbitmq.RelayIdentity(outboxName(bf))
	if _, err := id.Normalize(lease.DefaultOperationClasses()); err != nil {
		return nil, nil, fmt.Errorf("--rabbitmq-url-file: relay identity: %v", err)
	}
	rnd := make([]byte, 6)
	_, _ = rand.Read(rnd)
	host, _ := os.Hostname()
	instance := "serve-" + hex.EncodeToString(rnd)
	lr, err := rabbitmq.NewLeasedRelay(store, box, url, rabbitmq.LeasedRelayOptions{Identity: id,
		Caller: lease.Caller{PrincipalID: "starlease-relay", PrincipalClass: "service", ClientID: "starlease-serve",
			CredentialID: "starlease-serve-internal", CorrelationID: instance}, ServiceInstanceID: instance,
		TTL: rf.ttl, StaleAfter: rf.staleAfter, Logger: log,
		Relay: rabbitmq.RelayOptions{ConfirmTimeout: rf.confirmTimeout, PollInterval: rf.poll, Mandatory: rf.mandatory,
			ConnectionName: "starlease-relay " + host + " " + instance}})
	if err != nil {
		return nil, nil, err
	}
	registerRelayMetrics(reg, lr)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = lr.Run(rctx)
	}()
	log.Info("outbox relay started", "instance", instance, "lease_ttl", rf.ttl.String(), "outbox", id.TargetID)
	comps := map[string]func(context.Context) httpapi.ComponentHealth{"relay": func(context.Context) httpapi.ComponentHealth {
		st := lr.Status()
		h := httpapi.ComponentHealth{Status: "ok", Detail: map[string]any{"active": st.Active, "backlog": st.Backlog,
			"dead_letters": st.DeadLetters, "oldest_pending_age_ms": st.OldestAge.Milliseconds(),
			"confirmed": st.Stats.Confirmed, "failed": st.Stats.Failed}}
		if st.Degraded {
			h.Status, h.Reason = "degraded", st.Reason
		}
		return h
	}}
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			log.Error("outbox relay did not stop within 30s")
		}
	}
	return comps, stop, nil
}

// registerRelayMetrics exposes the relay's status on /metrics.
func registerRelayMetrics(reg *prometheus.Registry, lr *rabbitmq.LeasedRelay) {
	gauge := func(name, help string, f func(rabbitmq.LeasedRelayStatus) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(lr.Status()) })
	}
	counter := func(name, help string, f func(rabbitmq.LeasedRelayStatus) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(lr.Status())) })
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	reg.MustRegister(
		gauge("starlease_relay_active", "1 while this server's relay holds the outbox lease and publishes.",
			func(s rabbitmq.LeasedRelayStatus) float64 { return b(s.Active) }),
		gauge("starlease_relay_backlog_entries", "Publications pending in the outbox (-1: not measured).",
			func(s rabbitmq.LeasedRelayStatus) float64 { return float64(s.Backlog) }),
		gauge("starlease_relay_dead_letters", "Publications set aside as undeliverable (404/403 on publish, repeated nacks or returns), kept in the outbox's dead letters for an operator (-1: not measured).",
			func(s rabbitmq.LeasedRelayStatus) float64 { return float64(s.DeadLetters) }),
		counter("starlease_relay_dead_lettered_total", "Publications this server's relay moved to the outbox's dead letters.",
			func(s rabbitmq.LeasedRelayStatus) uint64 { return s.Stats.DeadLettered }),
		gauge("starlease_relay_oldest_pending_age_seconds", "Age of the oldest pending publication (relay lag); 0 when the outbox is empty.",
			func(s rabbitmq.LeasedRelayStatus) float64 { return s.OldestAge.Seconds() }),
		gauge("starlease_relay_degraded", "1 when the oldest pending publication is older than --relay-stale-after or the backlog cannot be measured.",
			func(s rabbitmq.LeasedRelayStatus) float64 { return b(s.Degraded) }),
		counter("starlease_relay_confirmed_total", "Publications the broker acknowledged.",
			func(s rabbitmq.LeasedRelayStatus) uint64 { return s.Stats.Confirmed }),
		counter("starlease_relay_removed_total", "Publications removed from the outbox after their ack.",
			func(s rabbitmq.LeasedRelayStatus) uint64 { return s.Stats.Removed }),
		counter("starlease_relay_failures_total", "Publications nacked, returned, unconfirmed in time or not sent (each stays in the outbox unless dead-lettered).",
			func(s rabbitmq.LeasedRelayStatus) uint64 { return s.Stats.Failed }),
		counter("starlease_relay_connects_total", "Connections the relay opened to the broker.",
			func(s rabbitmq.LeasedRelayStatus) uint64 { return s.Stats.Connects }),
		counter("starlease_relay_lease_terms_total", "Outbox lease terms this server's relay held.",
			func(s rabbitmq.LeasedRelayStatus) uint64 { return s.Terms }),
	)
}
