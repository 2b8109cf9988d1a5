package recovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// RabbitMQDialTimeout bounds opening the connection RabbitMQProof reads
// with (TCP, TLS and the AMQP handshake).
const RabbitMQDialTimeout = 10 * time.Second

// RabbitMQProof reads the ready messages of each named queue of the broker
// at amqpURL (amqp:// or amqps://) and observes the fence of each — the
// lock key and fencing token the relay put in its headers
// (rabbitmq.FenceOf) — in proof. A published but unconsumed message is a
// token accepted downstream that no consumer record holds yet.
//
// It opens one channel and, per queue, reads with basic.get and without
// acknowledging at most as many messages as the queue held when its read
// began (so messages published meanwhile do not keep it reading). Nothing
// is ever acknowledged: closing the channel returns every message read to
// its queue, back in its original position where the broker can place it
// there (it does on classic queues), marked redelivered although no
// consumer processed it. On a quorum queue every read counts
// towards the queue's delivery limit, if one is set, and the whole read
// must end within the broker's delivery acknowledgement timeout
// (consumer_timeout), or the broker closes the channel and the proof fails.
//
// Messages consumers hold unacknowledged are not ready and are not read;
// their tokens are proved by the consumers' records (MarksFileProof), so
// consumers are best stopped while recovery reads.
//
// A message without a complete, well-formed fence, or whose lock key is not
// a canonical lock key (rabbitmq.CheckLockKey), fails the whole proof with
// lease_corrupt; a missing queue (or none named) with invalid_request; a
// broker that cannot be reached or read with backend_unavailable. Nothing
// is skipped silently, and a failed proof records nothing. On success one
// entry per queue is appended to proof.Sources (broker host, vhost and
// queue, never credentials). RabbitMQProof never sets proof.Complete: only
// the operator can assert that every authoritative store was read.
func RabbitMQProof(ctx context.Context, amqpURL string, queues []string, proof *Proof) error {
	uri, err := amqp.ParseURI(amqpURL)
	if err != nil {
		// Not echoed: the URL may hold a password.
		return lease.Invalid("amqp_url", "not a valid AMQP URL")
	}
	if len(queues) == 0 {
		return lease.Invalid("queues", "no queue named; the downstream proof cannot be established")
	}
	seen := map[string]bool{}
	for _, q := range queues {
		// An empty name means the channel's last declared queue to the
		// broker, never a queue the operator named.
		if q == "" || seen[q] {
			return lease.Invalid("queues", fmt.Sprintf("queue name %q is empty or named twice", q))
		}
		seen[q] = true
	}
	broker := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	name := fmt.Sprintf("rabbitmq:%s://%s vhost %s", uri.Scheme, broker, uri.Vhost)

	cfg := amqp.Config{Properties: amqp.NewConnectionProperties(), Dial: func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: RabbitMQDialTimeout}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// Bounds the TLS and AMQP handshakes; the library clears it after.
		return c, c.SetDeadline(time.Now().Add(RabbitMQDialTimeout))
	}}
	cfg.Properties.SetClientConnectionName("starlease-recovery")
	conn, err := amqp.DialConfig(amqpURL, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("recovery: rabbitmq proof interrupted: %w", context.Cause(ctx))
		}
		return lease.Errorf(lease.CodeBackendUnavailable, "rabbitmq %s could not be reached", broker)
	}
	defer conn.Close()
	// basic.get takes no context: closing the connection ends a blocked call.
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	ch, err := conn.Channel()
	if err != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "rabbitmq %s: cannot open a channel", broker)
	}
	// Nothing read is acknowledged, so closing the channel (or, should that
	// fail, the connection) puts every message back.
	defer ch.Close()

	marks := map[string]uint64{}
	var sources []string
	for _, q := range queues {
		st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("recovery: rabbitmq proof interrupted: %w", context.Cause(ctx))
			}
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return lease.Invalid("queues", fmt.Sprintf("rabbitmq %s: queue %q does not exist; the downstream proof cannot be established", name, q))
			}
			return lease.Errorf(lease.CodeBackendUnavailable, "rabbitmq %s: queue %q cannot be read", name, q)
		}
		qmarks := map[string]uint64{}
		read := 0
		for read < st.Messages {
			d, ok, err := ch.Get(q, false)
			if ctx.Err() != nil {
				return fmt.Errorf("recovery: rabbitmq proof interrupted: %w", context.Cause(ctx))
			}
			if err != nil {
				return lease.Errorf(lease.CodeBackendUnavailable, "rabbitmq %s: queue %q cannot be read", name, q)
			}
			if !ok {
				break // a consumer took the rest meanwhile
			}
			read++
			f, err := rabbitmq.FenceOf(d)
			if err == nil {
				err = rabbitmq.CheckLockKey(f.LockKey)
			}
			if err != nil {
				return lease.Errorf(lease.CodeCorrupt, "rabbitmq %s: queue %q: message %d (id %q): %s; the downstream proof cannot be established",
					name, q, read, d.MessageId, err)
			}
			qmarks[f.LockKey] = max(qmarks[f.LockKey], f.FencingToken)
		}
		for k, t := range qmarks {
			marks[k] = max(marks[k], t)
		}
		sources = append(sources, fmt.Sprintf("%s queue %s (%d messages, %d lock keys)", name, q, read, len(qmarks)))
	}
	for k, t := range marks {
		proof.Observe(k, t)
	}
	proof.Sources = append(proof.Sources, sources...)
	return nil
}

// MarksFileProof observes in proof the marks of a consumer record: a marks
// file a consumer wrote from its Deduper (rabbitmq.WriteMarksFile), the
// highest token it accepted per lock key. The file is read strictly
// (rabbitmq.ReadMarksFile): a malformed one fails with lease_corrupt
// (wrapping the *rabbitmq.MarksError), an unreadable one with
// backend_unavailable, and nothing is recorded. On success the file is
// appended to proof.Sources. It never sets proof.Complete.
func MarksFileProof(path string, proof *Proof) error {
	marks, err := rabbitmq.ReadMarksFile(path)
	if err != nil {
		code := lease.CodeBackendUnavailable
		if errors.Is(err, rabbitmq.ErrMalformedMarks) {
			code = lease.CodeCorrupt
		}
		return fmt.Errorf("%w (%w)", lease.Errorf(code, "consumer marks %s cannot be read; the downstream proof cannot be established", path), err)
	}
	for k, t := range marks {
		proof.Observe(k, t)
	}
	proof.Sources = append(proof.Sources, fmt.Sprintf("rabbitmq-consumer-marks:%s (%d lock keys)", path, len(marks)))
	return nil
}
