package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/lease"
)

// Defaults of LeasedRelayOptions.
const (
	DefaultRelayLeaseTTL   = 15 * time.Second
	DefaultStaleAfter      = time.Minute
	DefaultMonitorInterval = time.Second
)

// RelayIdentity is the lock identity a server's relay leases its outbox
// under: tenant "starlease", program "relay", target namespace "outbox",
// target outboxName (the backend's outbox, e.g. "bolt" or
// "valkey.starlease"), actor "relay".
func RelayIdentity(outboxName string) lease.Identity {
	return lease.Identity{TenantID: lease.InternalTenant, ProgramID: "relay", TargetNamespace: "outbox",
		TargetID: outboxName, ActorName: "relay"}
}

// LeasedRelayOptions configures a LeasedRelay.
type LeasedRelayOptions struct {
	// Identity is the relay's lock identity (RelayIdentity). Required.
	Identity lease.Identity
	// Caller is the relay's owner context (a server-internal principal).
	Caller lease.Caller
	// ServiceInstanceID names this server. Required.
	ServiceInstanceID string
	// TTL is the relay lease's TTL; zero means DefaultRelayLeaseTTL. A
	// standby relay takes over within about one TTL of the holder's death.
	TTL time.Duration
	// Relay configures the relay. A zero ConfirmTimeout means the smaller
	// of DefaultConfirmTimeout and TTL/4: a batch is published only while
	// the lease is known (locally, conservatively) to outlive it.
	Relay RelayOptions
	// StaleAfter is the backlog age above which Status is degraded: the
	// oldest pending entry was accepted longer ago than this. Zero means
	// DefaultStaleAfter.
	StaleAfter time.Duration
	// MonitorInterval is how often the backlog is measured; zero means
	// DefaultMonitorInterval.
	MonitorInterval time.Duration
	Logger          *slog.Logger
}

// LeasedRelay runs a Relay while it holds a starlease lease on its outbox,
// like any leased actor (package executor): several servers in front of one
// backend each run one, and only the holder of the lease publishes; the
// others wait to acquire it and take over when it is released or expires
// (within about one TTL of the holder's death).
//
// # What the lease guarantees, and what it does not
//
// The outbox is filled only by fenced commits: whether a publication is
// accepted was decided, atomically, by the lease backend when the actor
// authorized it. The relay's lease does not add to that; it keeps relays
// from publishing concurrently (which would only duplicate messages, which
// consumers drop by message id).
//
//   - Publishing: a batch is read from the outbox, and so published, only
//     while this relay's lease term is live and its local expiry estimate
//     (the executor's, conservative: measured from the send time of the
//     renewal, minus a skew allowance) is more than ConfirmTimeout away;
//     publishing a batch is bounded by ConfirmTimeout and is cut off (the
//     socket is closed) the moment the executor cancels the term. So a
//     relay that lost its lease stops publishing, and a relay whose
//     renewals fail stops before its lease can expire at the backend. A
//     process paused between that check and a write (SIGSTOP, a long GC)
//     can still publish one batch after its lease expired: a broker cannot
//     check a fencing token. Those are duplicates of accepted
//     publications, never a refused one.
//   - Removal (OutboxDone): an entry is removed only after a broker
//     confirmed it under its message id, and only while this relay's lease
//     term has not been lost (a lost term's confirmed entries stay and are
//     published again by the successor, with the same message id). The
//     removal itself is not a backend-atomic conditional write on the
//     relay's lease (the backends' OutboxDone takes none); it does not need
//     to be for safety: removing an entry that a broker confirmed loses
//     nothing whoever removes it, and removing one that is already gone is
//     a no-op.
//
// Delivery stays at-least-once with a stable message id.
type LeasedRelay struct {
	store  executor.LeaseAPI
	outbox lease.Outbox
	relay  *Relay
	fenced *fencedOutbox
	o      LeasedRelayOptions
	log    *slog.Logger

	mu     sync.Mutex
	status LeasedRelayStatus
	terms  atomic.Uint64
}

// LeasedRelayStatus is what a LeasedRelay reports for /metrics and /readyz.
type LeasedRelayStatus struct {
	// Active reports that this relay holds the outbox lease now.
	Active bool
	// Terms counts the lease terms this relay has held.
	Terms uint64
	// Backlog is the number of pending entries (-1: not measured).
	Backlog int64
	// DeadLetters is the number of entries set aside as undeliverable
	// (lease.OutboxDeadLetters; -1: not measured or not kept).
	DeadLetters int64
	// OldestAge is how long ago the oldest pending entry was accepted
	// (zero with an empty outbox).
	OldestAge time.Duration
	// CheckedAt is when the backlog was last measured; CheckErr the last
	// measurement's failure, if it failed.
	CheckedAt time.Time
	CheckErr  string
	// Stats are the relay's counters.
	Stats RelayStats
	// Degraded reports a backlog older than StaleAfter or a backlog that
	// cannot be measured; Reason says which.
	Degraded bool
	Reason   string
}

// NewLeasedRelay returns a relay from outbox to the broker at amqpURL that
// leases its outbox through store (the same backend). It does nothing until
// Run.
func NewLeasedRelay(store executor.LeaseAPI, outbox lease.Outbox, amqpURL string, o LeasedRelayOptions) (*LeasedRelay, error) {
	if store == nil || outbox == nil {
		return nil, errors.New("rabbitmq: a leased relay needs a lease store and an outbox")
	}
	if o.ServiceInstanceID == "" {
		return nil, errors.New("rabbitmq: a leased relay needs a service instance id")
	}
	if o.TTL <= 0 {
		o.TTL = DefaultRelayLeaseTTL
	}
	if o.Relay.ConfirmTimeout <= 0 {
		o.Relay.ConfirmTimeout = min(DefaultConfirmTimeout, o.TTL/4)
	}
	if o.Relay.ConfirmTimeout >= o.TTL/2 {
		return nil, fmt.Errorf("rabbitmq: the relay's confirm timeout (%v) must be under half the lease TTL (%v)", o.Relay.ConfirmTimeout, o.TTL)
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.MonitorInterval <= 0 {
		o.MonitorInterval = DefaultMonitorInterval
	}
	// Its log names the outbox identity's target id.
	o.Logger = audit.ScreenLogger(o.Logger, nil)
	if o.Relay.Logger == nil {
		o.Relay.Logger = o.Logger
	}
	f := &fencedOutbox{inner: outbox, window: o.Relay.ConfirmTimeout}
	var relayed lease.Outbox = f
	if d, ok := outbox.(lease.OutboxDeadLetters); ok {
		relayed = fencedDeadLetters{f, d}
	}
	r, err := NewRelay(relayed, amqpURL, o.Relay)
	if err != nil {
		return nil, err
	}
	lr := &LeasedRelay{store: store, outbox: outbox, relay: r, fenced: f, o: o,
		log: o.Logger.With("component", "rabbitmq_leased_relay", "lock_target", o.Identity.TargetID)}
	lr.status.Backlog, lr.status.DeadLetters = -1, -1
	return lr, nil
}

// Wake makes the relay look at the outbox at once (if it holds the lease).
func (r *LeasedRelay) Wake() { r.relay.Wake() }

// Status returns the relay's latest status.
func (r *LeasedRelay) Status() LeasedRelayStatus {
	r.mu.Lock()
	s := r.status
	r.mu.Unlock()
	s.Active = r.fenced.cur.Load() != nil
	s.Terms = r.terms.Load()
	s.Stats = r.relay.Stats()
	return s
}

// Run acquires the outbox lease (waiting while another relay holds it),
// relays while it holds it, and starts over when the lease is lost. It
// returns when ctx ends, releasing the lease.
func (r *LeasedRelay) Run(ctx context.Context) error {
	mctx, stopMonitor := context.WithCancel(ctx)
	monitored := make(chan struct{})
	go func() { defer close(monitored); r.monitor(mctx) }()
	defer func() { stopMonitor(); <-monitored }()
	spec := executor.Spec{Identity: r.o.Identity, ServiceInstanceID: r.o.ServiceInstanceID, Caller: r.o.Caller,
		TTL: r.o.TTL, RenewMargin: r.o.TTL / 2, AcquireWait: r.o.TTL, Logger: r.o.Logger}
	bo := backoff{min: r.relay.o.MinBackoff, max: r.relay.o.MaxBackoff}
	for ctx.Err() == nil {
		spec.ExecutionID = executor.NewRequestID()
		spec.JobID = "relay-" + spec.ExecutionID
		err := executor.Run(ctx, r.store, spec, func(wctx context.Context, l *executor.Lease) error {
			r.terms.Add(1)
			t := &term{l: l, ctx: wctx}
			r.fenced.cur.Store(t)
			defer r.fenced.cur.CompareAndSwap(t, nil)
			r.log.Info("relay holds the outbox lease; publishing", "lease_id", l.LeaseID(), "fencing_token", l.FencingToken())
			r.relay.Wake()
			err := r.relay.Run(wctx)
			if cause := context.Cause(wctx); executor.LeaseLoss(cause) {
				r.log.Warn("relay lost the outbox lease; stopped publishing", "cause", cause)
			}
			return err
		})
		switch {
		case ctx.Err() != nil:
		case lease.CodeOf(err) == lease.CodeConflict:
			// Another server's relay holds it: stay standby.
			bo.reset()
		default:
			// A lost term (the executor's cause) or a refused or failed
			// acquisition: try again after a bounded backoff.
			r.log.Warn("relay lease term ended", "err", err)
			sleep(ctx, bo.next())
		}
	}
	return context.Cause(ctx)
}

// monitor measures the backlog every MonitorInterval.
func (r *LeasedRelay) monitor(ctx context.Context) {
	tick := time.NewTicker(r.o.MonitorInterval)
	defer tick.Stop()
	for {
		r.measure(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// outboxLen is a backend that counts its outbox.
type outboxLen interface {
	OutboxLen(ctx context.Context) (int64, error)
}

func (r *LeasedRelay) measure(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, r.o.MonitorInterval+time.Second)
	defer cancel()
	st := LeasedRelayStatus{Backlog: -1, DeadLetters: -1, CheckedAt: time.Now()}
	head, err := r.outbox.OutboxPending(cctx, 1)
	if err == nil && len(head) > 0 {
		st.OldestAge = max(0, time.Since(head[0].AcceptedAt.Time()))
	}
	if err == nil {
		if c, ok := r.outbox.(outboxLen); ok {
			st.Backlog, err = c.OutboxLen(cctx)
		} else if len(head) == 0 {
			st.Backlog = 0
		}
	}
	if d, ok := r.outbox.(lease.OutboxDeadLetters); ok && err == nil {
		st.DeadLetters, err = d.OutboxDeadLen(cctx)
	}
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		st.CheckErr = fmt.Sprintf("%s: %v", lease.CodeOf(err), err)
		st.Degraded, st.Reason = true, "relay: the outbox backlog cannot be measured"
	case st.OldestAge > r.o.StaleAfter:
		st.Degraded, st.Reason = true, fmt.Sprintf("relay: the oldest pending publication is %v old (bound %v)",
			st.OldestAge.Round(time.Second), r.o.StaleAfter)
	}
	r.mu.Lock()
	r.status = st
	r.mu.Unlock()
}

// term is one lease term of the relay.
type term struct {
	l   *executor.Lease
	ctx context.Context
}

// errNotHolder refuses outbox access outside a live lease term.
var errNotHolder = &lease.Error{Code: lease.CodeLost, Reason: "relay: not holding the outbox lease (or too close to its expiry to publish a batch)"}

// fencedOutbox is the relay's view of the outbox, gated by its lease term.
type fencedOutbox struct {
	inner  lease.Outbox
	cur    atomic.Pointer[term]
	window time.Duration
}

// OutboxPending reads a batch only while the term is live and the lease's
// local expiry estimate is more than window (the bound on publishing one
// batch) away.
func (f *fencedOutbox) OutboxPending(ctx context.Context, limit int) ([]lease.OutboxEntry, error) {
	t := f.cur.Load()
	if t == nil || t.ctx.Err() != nil || time.Until(t.l.LocalExpiry()) <= f.window {
		return nil, errNotHolder
	}
	return f.inner.OutboxPending(ctx, limit)
}

// OutboxDone removes a confirmed entry unless the term was lost. A term
// that ended because the server is stopping still settles its last batch.
func (f *fencedOutbox) OutboxDone(ctx context.Context, messageID string) error {
	t := f.cur.Load()
	if t == nil || executor.LeaseLoss(context.Cause(t.ctx)) {
		return errNotHolder
	}
	return f.inner.OutboxDone(ctx, messageID)
}

// fencedDeadLetters is the fenced outbox of a backend with dead letters.
type fencedDeadLetters struct {
	*fencedOutbox
	dead lease.OutboxDeadLetters
}

// OutboxDeadLetter sets an entry aside unless the term was lost (as
// OutboxDone: a successor publishes it again and decides for itself).
func (f fencedDeadLetters) OutboxDeadLetter(ctx context.Context, messageID, reason string) error {
	t := f.cur.Load()
	if t == nil || executor.LeaseLoss(context.Cause(t.ctx)) {
		return errNotHolder
	}
	return f.dead.OutboxDeadLetter(ctx, messageID, reason)
}

func (f fencedDeadLetters) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	return f.dead.OutboxDeadLetters(ctx, limit)
}

func (f fencedDeadLetters) OutboxDeadLen(ctx context.Context) (int64, error) {
	return f.dead.OutboxDeadLen(ctx)
}
