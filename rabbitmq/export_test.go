package rabbitmq

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/lease"
)

// SetBeforeDone installs the relay's test hook: f runs after the broker
// acknowledged an entry and before OutboxDone; an error ends Run with it,
// as a crash at that point would. Call it before Run.
func SetBeforeDone(r *Relay, f func(lease.OutboxEntry) error) { r.beforeDone = f }

// SetOnBackoff installs a test hook that Run tells each backoff it waits.
// Call it before Run.
func SetOnBackoff(r *Relay, f func(time.Duration)) { r.onBackoff = f }

// Publishing is the AMQP message the relay publishes for an entry.
func Publishing(e lease.OutboxEntry) amqp.Publishing { return publishing(e) }
