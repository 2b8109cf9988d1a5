package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/lease"
)

// Defaults of RelayOptions.
const (
	DefaultBatchSize      = 64
	DefaultPollInterval   = 250 * time.Millisecond
	DefaultConfirmTimeout = 10 * time.Second
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	DefaultDialTimeout    = 5 * time.Second
	DefaultHeartbeat      = 10 * time.Second
	DefaultStoreTimeout   = 5 * time.Second
	DefaultConnectionName = "starlease-relay"
	DefaultPoisonAttempts = 10
)

// RelayOptions configures a Relay. Zero values mean the defaults.
type RelayOptions struct {
	// BatchSize is how many outbox entries one round reads and publishes
	// before waiting for their confirms (the store's maximum page size
	// caps it).
	BatchSize int
	// PollInterval is how long the relay waits before looking at an empty
	// outbox again (Wake cuts it short).
	PollInterval time.Duration
	// ConfirmTimeout bounds the publishing of one batch and, separately,
	// the wait for its confirms. An entry not confirmed in time is kept
	// and the connection is replaced.
	ConfirmTimeout time.Duration
	// MinBackoff and MaxBackoff bound the delay before a retry after a
	// failure (connect, publish, nack, return, store error). It doubles
	// from MinBackoff up to MaxBackoff, with jitter, and resets after a
	// round without failure or one that removed or dead-lettered an entry.
	MinBackoff, MaxBackoff time.Duration
	// DialTimeout bounds opening a connection (TCP, TLS, AMQP handshake).
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval; a dead peer is noticed
	// after a few missed heartbeats.
	Heartbeat time.Duration
	// StoreTimeout bounds each OutboxDone call. OutboxDone runs even
	// after the Run context ended, so an entry the broker acknowledged is
	// not published again only because the relay was stopping.
	StoreTimeout time.Duration
	// Mandatory publishes with the mandatory flag: a message the broker
	// cannot route to any queue is returned, and the relay keeps it in the
	// outbox and retries it, PoisonAttempts times in a row, then sets it
	// aside as a dead letter (see Relay) so it does not hold back later
	// entries. Without Mandatory the broker acknowledges and drops an
	// unroutable message, and the relay removes it from the outbox.
	Mandatory bool
	// PoisonAttempts is how many times in a row one entry may be nacked
	// (or, with Mandatory, returned) before the relay dead-letters it. Zero
	// means DefaultPoisonAttempts. (A publish the broker refuses by closing
	// the channel with 404 NOT_FOUND, 403 ACCESS_REFUSED or 406
	// PRECONDITION_FAILED is dead-lettered
	// at once, once it was published alone.)
	PoisonAttempts int
	// TLS configures amqps:// connections; nil means the library default.
	TLS *tls.Config
	// ConnectionName is the connection name the broker shows.
	ConnectionName string
	// Logger receives relay events; nil means slog.Default(). The broker
	// URL (which may hold a password) is never logged, only its host, and
	// secret-shaped values are screened (audit.ScreenLogger).
	Logger *slog.Logger
}

func (o RelayOptions) withDefaults() RelayOptions {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	def(&o.PollInterval, DefaultPollInterval)
	def(&o.ConfirmTimeout, DefaultConfirmTimeout)
	def(&o.MinBackoff, DefaultMinBackoff)
	def(&o.MaxBackoff, DefaultMaxBackoff)
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	def(&o.DialTimeout, DefaultDialTimeout)
	def(&o.Heartbeat, DefaultHeartbeat)
	def(&o.StoreTimeout, DefaultStoreTimeout)
	if o.ConnectionName == "" {
		o.ConnectionName = DefaultConnectionName
	}
	if o.PoisonAttempts <= 0 {
		o.PoisonAttempts = DefaultPoisonAttempts
	}
	o.Logger = audit.ScreenLogger(o.Logger, nil)
	return o
}

// RelayStats counts what a relay did since it was made.
type RelayStats struct {
	// Confirmed counts publications the broker acknowledged (returned
	// ones included).
	Confirmed uint64
	// Removed counts entries removed from the outbox after their ack.
	Removed uint64
	// Failed counts publications that were nacked, returned, not confirmed
	// in time or not sent; each stays in the outbox unless it was
	// dead-lettered (DeadLettered).
	Failed uint64
	// Connects counts connections opened to the broker.
	Connects uint64
	// DeadLettered counts entries this relay set aside as dead letters
	// (lease.OutboxDeadLetters); the outbox's own count is OutboxDeadLen.
	DeadLettered uint64
}

// Relay publishes the entries of a fenced outbox to RabbitMQ and removes
// each one only after the broker confirmed it.
//
// Every entry is published with publisher confirms, delivery mode
// persistent, its stable message id, content type, body, exchange and
// routing key, and the fence in headers (HeaderLockKey and the others).
//
// Entries are published in the order the outbox returns them (acceptance
// order), pipelined a batch at a time: the relay publishes the batch, then
// waits for every confirm. An entry that fails (nack, return, timeout, lost
// connection) stays in the outbox and is retried after a backoff, from the
// head of the outbox; the entries of the same batch that the broker did
// confirm are removed. So order holds except around a failure, where a
// failed entry can arrive after later ones; a consumer's Deduper then drops
// it if a higher token of its lock key was already processed.
//
// # Poison entries
//
// An entry the broker refuses for a reason retrying will not cure would
// stay at the head of the outbox and hold back every later entry, of every
// tenant. If the outbox implements lease.OutboxDeadLetters (bolt and
// valkey do), the relay moves such an entry into the outbox's dead letters
// (kept with its reason, counted, bounded by lease.MaxOutboxDeadLetters,
// never deleted by the relay) and goes on with the next entries:
//
//   - the broker closed the channel with 404 NOT_FOUND (no such exchange),
//     403 ACCESS_REFUSED or 406 PRECONDITION_FAILED (a message the broker
//     will never take, such as a malformed routing header stored before
//     such headers were refused) for its publish: the channel's close names no
//     publish, so the relay first publishes the batch's unconfirmed entries
//     one at a time, and dead-letters the one whose lone publish closes the
//     channel with that code;
//   - it was nacked PoisonAttempts times in a row (a queue length limit
//     with reject-publish, for example);
//   - with Mandatory, it was returned as unroutable PoisonAttempts times in
//     a row.
//
// Anything else (a lost connection, a broker that is down, a confirm
// timeout, a channel or connection closed for another reason, a store
// error) is transient: the entry stays pending, in order, and is retried,
// so a broker outage loses nothing. With the dead letters full the entry
// stays pending too (and blocks, loudly logged) rather than being dropped.
//
// Delivery is at-least-once: a relay that stops (crash, kill, lost
// connection, store error) after the broker acknowledged an entry but
// before OutboxDone publishes it again later with the same message id.
// Consumers drop such duplicates by message id (Deduper).
type Relay struct {
	outbox lease.Outbox
	url    string
	o      RelayOptions
	log    *slog.Logger
	wake   chan struct{}

	running atomic.Bool
	stats   struct{ confirmed, removed, failed, connects, dead atomic.Uint64 }

	// deadOut is the outbox's dead letters, nil if it has none.
	deadOut lease.OutboxDeadLetters
	// strikes counts, per message id, the nacks or returns in a row
	// (only Run's goroutine touches it).
	strikes map[string]int
	// isolate is how many more entries are to be published one at a time
	// to find which one made the broker close the channel (404, 403, 406).
	isolate int

	// beforeDone, if set (tests only), runs after the broker acknowledged
	// an entry and before OutboxDone; an error ends Run with that error,
	// as a crash at that point would.
	beforeDone func(lease.OutboxEntry) error
	// onBackoff, if set (tests only), is told each backoff Run waits.
	onBackoff func(time.Duration)
}

// NewRelay returns a relay from outbox to the broker at amqpURL
// (amqp:// or amqps://). It does not connect until Run.
func NewRelay(outbox lease.Outbox, amqpURL string, opts RelayOptions) (*Relay, error) {
	if outbox == nil {
		return nil, errors.New("rabbitmq: relay needs an outbox")
	}
	uri, err := amqp.ParseURI(amqpURL)
	if err != nil {
		// Not wrapped: the URL may hold a password.
		return nil, errors.New("rabbitmq: invalid AMQP URL")
	}
	o := opts.withDefaults()
	r := &Relay{outbox: outbox, url: amqpURL, o: o,
		log:     o.Logger.With("component", "rabbitmq_relay", "broker", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))),
		wake:    make(chan struct{}, 1),
		strikes: map[string]int{}}
	r.deadOut, _ = outbox.(lease.OutboxDeadLetters)
	return r, nil
}

// Wake makes a relay waiting on an empty outbox look again at once (for
// example right after a Publish). It never blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Confirmed: r.stats.confirmed.Load(), Removed: r.stats.removed.Load(),
		Failed: r.stats.failed.Load(), Connects: r.stats.connects.Load(), DeadLettered: r.stats.dead.Load()}
}

// errRunning reports a second concurrent Run of one relay.
var errRunning = errors.New("rabbitmq: relay is already running")

// Run relays until ctx ends, then returns context.Cause(ctx). It connects
// (and reconnects after a lost connection) with bounded backoff; failures
// of the broker or the store are logged and retried, never returned. A
// batch whose confirms are awaited when ctx ends is still settled (for at
// most ConfirmTimeout), so its acknowledged entries are removed. One relay
// runs once at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer r.running.Store(false)
	var s *session
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	bo := backoff{min: r.o.MinBackoff, max: r.o.MaxBackoff}
	wait := func() {
		d := bo.next()
		if r.onBackoff != nil {
			r.onBackoff(d)
		}
		sleep(ctx, d)
	}
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if s == nil {
			var err error
			if s, err = r.connect(); err != nil {
				s = nil
				r.log.Warn("relay cannot reach the broker; retrying", "err", err)
				wait()
				continue
			}
			r.stats.connects.Add(1)
			r.log.Info("relay connected to the broker")
		}
		limit := r.o.BatchSize
		if r.isolate > 0 {
			limit = 1
		}
		entries, err := r.outbox.OutboxPending(ctx, limit)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Error("relay cannot read the outbox; retrying", "code", lease.CodeOf(err), "err", err)
				wait()
			}
			continue
		}
		if len(entries) == 0 {
			bo.reset()
			t := time.NewTimer(r.o.PollInterval)
			select {
			case <-ctx.Done():
			case <-r.wake:
			case <-t.C:
			case <-s.connClosed:
				r.log.Warn("relay lost the broker connection while idle")
				s.close()
				s = nil
			}
			t.Stop()
			continue
		}
		settled := r.settled()
		fatal, err := r.relayBatch(ctx, s, entries)
		if fatal != nil {
			return fatal
		}
		if err != nil {
			r.log.Warn("relay batch incomplete; pending entries stay in the outbox", "err", err)
			if s.broken() {
				s.close()
				s = nil
			}
			// A round that removed or dead-lettered an entry moved the
			// head of the outbox: what fails next is a new failure. So a
			// run of poison entries (one caller's, say) costs one round
			// each at the least backoff, not ever longer waits for every
			// publication behind them.
			if r.settled() != settled {
				bo.reset()
			}
			wait()
			continue
		}
		bo.reset()
	}
}

// relayBatch publishes entries, waits for their confirms and removes the
// acknowledged ones from the outbox. err reports a partial batch (the
// failed entries stay); fatal is the test hook's simulated crash.
func (r *Relay) relayBatch(ctx context.Context, s *session, entries []lease.OutboxEntry) (fatal, err error) {
	s.drainReturns() // left over from an earlier batch that failed

	// Publishing: a write the broker does not read (flow control, a dead
	// peer) blocks; the watchdog closes the socket after ConfirmTimeout or
	// when ctx ends, which fails the write.
	pubCtx, cancelPub := context.WithTimeout(ctx, r.o.ConfirmTimeout)
	stopWatchdog := context.AfterFunc(pubCtx, s.abort)
	confs := make([]*amqp.DeferredConfirmation, 0, len(entries))
	var pubErr error
	for _, e := range entries {
		dc, perr := s.ch.PublishWithDeferredConfirmWithContext(pubCtx, e.Message.Exchange, e.Message.RoutingKey,
			r.o.Mandatory, false, publishing(e))
		if perr == nil && dc == nil {
			perr = errors.New("channel is not in confirm mode")
		}
		if perr != nil {
			pubErr = fmt.Errorf("publish %s: %w", e.MessageID, perr)
			s.markBroken()
			break
		}
		confs = append(confs, dc)
	}
	if !stopWatchdog() {
		s.markBroken()
	}
	cancelPub()

	// Confirms: settled even when ctx ends meanwhile, within the timeout.
	waitCtx, cancelWait := context.WithTimeout(context.WithoutCancel(ctx), r.o.ConfirmTimeout)
	defer cancelWait()
	acked := make([]bool, len(confs))
	nacked := make([]bool, len(confs)) // settled without an ack
	var waitErr error
	for i, dc := range confs {
		ok, werr := dc.WaitContext(waitCtx)
		if werr != nil {
			waitErr = fmt.Errorf("no confirm within %v", r.o.ConfirmTimeout)
			s.markBroken()
			break
		}
		acked[i], nacked[i] = ok, !ok
	}
	returned := s.drainReturns()
	chErr := s.channelError()
	if s.ch.IsClosed() {
		s.markBroken()
	}
	// refused: the broker closed the channel over a publish (not the
	// connection): no such exchange, or no right to publish to it.
	refused := chErr != nil && (chErr.Code == amqp.NotFound || chErr.Code == amqp.AccessRefused ||
		chErr.Code == amqp.PreconditionFailed) && !s.conn.IsClosed()
	if len(entries) > 1 && r.isolate == 0 && refused {
		r.isolate = len(entries) - countTrue(acked)
		r.log.Warn("broker closed the channel over a publication; publishing the unconfirmed ones one at a time to find it",
			"code", chErr.Code, "reason", chErr.Reason, "entries", r.isolate)
	}
	if r.isolate > 0 && len(entries) == 1 && (len(confs) == 1 && (acked[0] || refused)) {
		r.isolate--
	}
	if len(r.strikes) > 4*r.o.BatchSize+1024 {
		clear(r.strikes) // entries relayed by another relay, or gone: forget
	}

	failed := len(entries) - len(confs)
	var doneErr error
	for i := range confs {
		e := entries[i]
		switch {
		case !acked[i] && refused && len(entries) == 1:
			// Published alone, so this publish is the one refused.
			failed++
			r.deadLetter(ctx, e, fmt.Sprintf("broker closed the channel on its publish: %d %s", chErr.Code, chErr.Reason))
			continue
		case nacked[i] && !s.ch.IsClosed():
			// A nack on an open channel (a closing channel nacks whatever
			// it had pending): the broker refused this message.
			failed++
			r.strike(ctx, e, "nacked by the broker")
			continue
		case !acked[i]:
			failed++
			continue
		case returned[e.MessageID] != nil:
			r.stats.confirmed.Add(1)
			failed++
			ret := returned[e.MessageID]
			r.log.Warn("broker returned an unroutable publication; kept in the outbox",
				"message_id", e.MessageID, "fencing_token", e.FencingToken, "reply_code", ret.ReplyCode, "reply_text", ret.ReplyText)
			r.strike(ctx, e, fmt.Sprintf("returned by the broker as unroutable (%d %s)", ret.ReplyCode, ret.ReplyText))
			continue
		}
		delete(r.strikes, e.MessageID)
		r.stats.confirmed.Add(1)
		if r.beforeDone != nil {
			if err := r.beforeDone(e); err != nil {
				return err, nil
			}
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.StoreTimeout)
		derr := r.outbox.OutboxDone(dctx, e.MessageID)
		cancel()
		if derr != nil {
			// The message is at the broker; it will be published again
			// (same message id) and consumers drop the duplicate.
			r.log.Error("broker confirmed a publication but the outbox cannot remove it; it will be republished",
				"message_id", e.MessageID, "code", lease.CodeOf(derr), "err", derr)
			if doneErr == nil {
				doneErr = derr
			}
			continue
		}
		r.stats.removed.Add(1)
	}
	r.stats.failed.Add(uint64(failed))
	if failed > 0 || doneErr != nil {
		return nil, errors.Join(pubErr, waitErr, errorIf(failed > 0, fmt.Sprintf("%d of %d publications not confirmed", failed, len(entries))), doneErr)
	}
	return nil, nil
}

// settled counts the entries this relay took out of the pending outbox:
// removed after the broker's confirm, or dead-lettered.
func (r *Relay) settled() uint64 { return r.stats.removed.Load() + r.stats.dead.Load() }

// strike counts a nack or return of e; the PoisonAttempts-th in a row
// dead-letters it.
func (r *Relay) strike(ctx context.Context, e lease.OutboxEntry, why string) {
	r.strikes[e.MessageID]++
	if n := r.strikes[e.MessageID]; n >= r.o.PoisonAttempts {
		r.deadLetter(ctx, e, fmt.Sprintf("%s %d times in a row", why, n))
	}
}

// deadLetter moves e out of the pending outbox into its dead letters, if
// the outbox has them; on failure e stays pending (and is retried).
func (r *Relay) deadLetter(ctx context.Context, e lease.OutboxEntry, reason string) {
	attrs := []any{"message_id", e.MessageID, "fencing_token", e.FencingToken, "lease_id", e.LeaseID,
		"exchange", e.Message.Exchange, "routing_key", e.Message.RoutingKey, "reason", reason}
	if r.deadOut == nil {
		r.log.Error("undeliverable publication blocks the outbox (the outbox keeps no dead letters)", attrs...)
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.StoreTimeout)
	err := r.deadOut.OutboxDeadLetter(dctx, e.MessageID, reason)
	cancel()
	if err != nil {
		r.log.Error("undeliverable publication cannot be dead-lettered; it stays pending and blocks the outbox",
			append(attrs, "code", lease.CodeOf(err), "err", err)...)
		return
	}
	delete(r.strikes, e.MessageID)
	r.stats.dead.Add(1)
	r.log.Error("ALERT undeliverable publication moved to the outbox's dead letters", attrs...)
}

func countTrue(v []bool) int {
	n := 0
	for _, b := range v {
		if b {
			n++
		}
	}
	return n
}

func errorIf(cond bool, msg string) error {
	if !cond {
		return nil
	}
	return errors.New(msg)
}

// session is one connection and its confirm-mode channel.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	raw        atomic.Pointer[net.Conn]
	returns    chan amqp.Return
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
	chErr      *amqp.Error
	isBroken   atomic.Bool
}

func (r *Relay) connect() (*session, error) {
	s := &session{}
	cfg := amqp.Config{
		Heartbeat:       r.o.Heartbeat,
		TLSClientConfig: r.o.TLS,
		Properties:      amqp.NewConnectionProperties(),
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(r.o.DialTimeout)(network, addr)
			if err == nil {
				s.raw.Store(&c)
			}
			return c, err
		},
	}
	cfg.Properties.SetClientConnectionName(r.o.ConnectionName)
	conn, err := amqp.DialConfig(r.url, cfg)
	if err != nil {
		return nil, redact(err, r.url)
	}
	s.conn = conn
	s.connClosed = conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		s.close()
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		s.close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	s.ch = ch
	s.chClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	// Buffered for a whole batch: the library's dispatcher must never
	// block on it (a return precedes its message's ack).
	s.returns = ch.NotifyReturn(make(chan amqp.Return, r.o.BatchSize+1))
	return s, nil
}

// redact keeps a dial error from echoing the URL's password.
func redact(err error, url string) error {
	if u, perr := amqp.ParseURI(url); perr == nil && u.Password != "" {
		return errors.New(strings.ReplaceAll(err.Error(), u.Password, "xxxxx"))
	}
	return err
}

// drainReturns empties the return channel and reports the returns by
// message id.
func (s *session) drainReturns() map[string]*amqp.Return {
	var ids map[string]*amqp.Return
	for {
		select {
		case ret, ok := <-s.returns:
			if !ok {
				return ids
			}
			if ids == nil {
				ids = map[string]*amqp.Return{}
			}
			ids[ret.MessageId] = &ret
		default:
			return ids
		}
	}
}

// channelError is the error the channel was closed with, if it was closed
// by the broker.
func (s *session) channelError() *amqp.Error {
	if s.chErr == nil {
		select {
		case e, ok := <-s.chClosed:
			if ok {
				s.chErr = e
			}
		default:
		}
	}
	return s.chErr
}

func (s *session) markBroken() { s.isBroken.Store(true) }

func (s *session) broken() bool { return s.isBroken.Load() || s.conn.IsClosed() }

// abort closes the socket under the connection, failing any blocked write.
func (s *session) abort() {
	s.markBroken()
	if c := s.raw.Load(); c != nil {
		_ = (*c).Close()
	}
}

// close ends the connection; a peer that does not answer the close is cut
// off after a second.
func (s *session) close() {
	if s.conn == nil {
		return
	}
	if err := s.conn.CloseDeadline(time.Now().Add(time.Second)); err != nil && !errors.Is(err, amqp.ErrClosed) {
		s.abort()
	}
}

// backoff is a bounded exponential backoff with jitter.
type backoff struct{ min, max, cur time.Duration }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else if b.cur *= 2; b.cur > b.max {
		b.cur = b.max
	}
	// Equal jitter: between half and all of the current step.
	half := b.cur / 2
	return half + rand.N(b.cur-half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
