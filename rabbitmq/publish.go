package rabbitmq

import (
	"context"
	"maps"
	"time"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// DefaultSink is the sink name publications are authorized under: the
// lease backend keeps the highest accepted token per lock key and sink.
const DefaultSink = "rabbitmq"

// Defaults of a Publisher (the same as a fence.Committer's).
const (
	DefaultAttempts    = fence.DefaultAttempts
	DefaultCallTimeout = fence.DefaultCallTimeout
	DefaultBackoff     = fence.DefaultBackoff
)

// PublisherOption configures a Publisher.
type PublisherOption func(*Publisher)

// WithSink sets the sink name (a canonical identifier); empty means
// DefaultSink.
func WithSink(name string) PublisherOption { return func(p *Publisher) { p.sink = name } }

// WithCaller sets the owner's security context. An empty PrincipalID is
// taken from the envelope of each publication, as fence.NewCommitter does.
func WithCaller(c lease.Caller) PublisherOption { return func(p *Publisher) { p.caller = c } }

// WithAttempts bounds how many times one authorization is sent (first try
// included) when the outcome is unknown or the backend cannot answer; every
// retry uses the same commit id. n < 1 means DefaultAttempts.
func WithAttempts(n int) PublisherOption { return func(p *Publisher) { p.retry.Attempts = n } }

// WithCallTimeout bounds each AuthorizeCommit call; its deadline_at is the
// earlier of now+d and the context's deadline.
func WithCallTimeout(d time.Duration) PublisherOption {
	return func(p *Publisher) { p.retry.CallTimeout = d }
}

// WithBackoff sets the first retry delay (doubled on each retry).
func WithBackoff(d time.Duration) PublisherOption { return func(p *Publisher) { p.retry.Backoff = d } }

// WithClock sets the clock deadlines are computed from.
func WithClock(now func() time.Time) PublisherOption { return func(p *Publisher) { p.retry.Now = now } }

// WithLossHandler registers f, called (synchronously, before Publish
// returns) when the backend reports the lease gone: lease_lost or
// commit_rejected. Leased work passes what cancels it (the fence.Committer's
// own loss handler cannot be reached from outside package fence).
func WithLossHandler(f func(err *lease.Error)) PublisherOption {
	return func(p *Publisher) { p.onLoss = f }
}

// Publisher appends publications to the lease backend's fenced outbox under
// a lease. It is safe for concurrent use.
type Publisher struct {
	authz  fence.Authorizer
	sink   string
	caller lease.Caller
	retry  fence.Retry
	onLoss func(*lease.Error)
}

// NewPublisher returns a publisher that authorizes through authz: the same
// lease backend the committer's lease lives in (a lease.Store, or an adapter
// over the HTTP client), which must also hold the outbox the relay reads.
func NewPublisher(authz fence.Authorizer, opts ...PublisherOption) *Publisher {
	p := &Publisher{authz: authz}
	for _, o := range opts {
		o(p)
	}
	if p.sink == "" {
		p.sink = DefaultSink
	}
	p.retry = p.retry.WithDefaults()
	return p
}

// Publication is an accepted publication: it is in the outbox and the relay
// will publish it.
type Publication struct {
	// MessageID is the AMQP message id the relay publishes it with. It is
	// the same on every publish of this commit.
	MessageID string
	// Guard is the fence of the accepted commit, as the relay's headers
	// carry it.
	Guard fence.Guard
	// Replayed reports that the commit id had already been accepted (a
	// retry): nothing new entered the outbox.
	Replayed bool
}

// Publish appends msg to the fenced outbox under the lease of c, in the same
// atomic backend operation as the lease check: AuthorizeCommit with Outbox
// set, for the commit id commitID on the publisher's sink. The publisher's
// own options (caller, retries) apply; a lease_lost or commit_rejected
// answer is also reported to c's loss handler, so an executor's work is
// cancelled on a refused publication as on a refused commit.
//
// The commit id names the publication: a retry with the same id and
// message returns the original acceptance (Replayed) and appends nothing,
// so outcome_unknown, backend_unavailable, deadline_exceeded and
// rate-limited answers are retried with the same id up to the configured
// attempts. The same id with a different message is idempotency_conflict.
// Errors are *lease.Error: lease_lost (the lease is not held at backend
// time: nothing entered the outbox), commit_rejected (the token is below
// the sink's high-water mark), outcome_unknown (unresolved after every
// attempt: retry later with the same id, never with a new one),
// invalid_lease_request, idempotency_conflict.
func (p *Publisher) Publish(ctx context.Context, c *fence.Committer, commitID string, msg lease.OutboxMessage) (Publication, error) {
	env := c.Envelope()
	if err := env.Validate(); err != nil {
		return Publication{}, err
	}
	caller := p.caller
	if caller.PrincipalID == "" {
		caller.PrincipalID = env.OwnerPrincipalID
	}
	// The request's Outbox points at a private copy: the caller's body
	// slice and headers map may change after Publish returns (or between
	// its attempts), a stored entry must not.
	msg.Body = append([]byte(nil), msg.Body...)
	msg.Headers = maps.Clone(msg.Headers)
	// The message id is a function of the commit; deriving it validates
	// the request locally before anything is sent.
	probe := env.CommitRequest(p.sink, commitID, fence.Binding{}, p.retry.Now().Add(p.retry.CallTimeout), caller)
	probe.Outbox = &msg
	id, err := messageID(probe)
	if err != nil {
		return Publication{}, err
	}
	res, err := p.retry.Authorize(ctx, p.authz, func(deadline time.Time) lease.CommitRequest {
		req := env.CommitRequest(p.sink, commitID, fence.Binding{}, deadline, caller)
		req.Outbox = &msg
		return req
	})
	if err != nil {
		return Publication{}, p.refused(c, err)
	}
	// The publication is the write: the backend binds the commit to this
	// message id and body, and an answer bound to anything else is refused.
	if err := fence.CheckCommit(env, commitID, fence.Binding{Target: id, PayloadSHA256: lease.PayloadSHA256(msg.Body)}, res); err != nil {
		return Publication{}, err
	}
	return Publication{MessageID: id, Guard: fence.NewGuard(env, res.Commit), Replayed: res.Replayed}, nil
}

// refused reports a lease_lost or commit_rejected answer to the
// committer's loss handler (an executor then cancels the work) and to the
// publisher's own, and returns err.
func (p *Publisher) refused(c *fence.Committer, err error) error {
	if le := lease.AsError(err); le.Code == lease.CodeLost || le.Code == lease.CodeCommitRejected {
		c.ReportLoss(le)
		if p.onLoss != nil {
			p.onLoss(le)
		}
	}
	return err
}

// Publish is NewPublisher(authz).Publish(ctx, c, commitID, msg): one
// publication under the lease of c with the default options.
func Publish(ctx context.Context, authz fence.Authorizer, c *fence.Committer, commitID string, msg lease.OutboxMessage) (Publication, error) {
	return NewPublisher(authz).Publish(ctx, c, commitID, msg)
}

// MessageID returns the message id the publication of commit commitID on
// sink under env is published with (lease.OutboxMessageID of the commit's
// scope: lock key, sink and commit id). It is a pure function; consumers
// and operators can use it to correlate a delivery with its commit.
func MessageID(env fence.Envelope, sink, commitID string) (string, error) {
	if sink == "" {
		sink = DefaultSink
	}
	if err := env.Validate(); err != nil {
		return "", err
	}
	req := env.CommitRequest(sink, commitID, fence.Binding{}, time.Now().Add(time.Minute),
		lease.Caller{PrincipalID: env.OwnerPrincipalID})
	// The id depends on the lock key, sink and commit id alone; any
	// publication makes the request one.
	req.Outbox = &lease.OutboxMessage{RoutingKey: "message-id"}
	return messageID(req)
}

// messageID derives the stable message id of req the way the backends do.
// The identity is re-validated with its own operation class allowed (the
// backend has already checked it against its configured classes).
func messageID(req lease.CommitRequest) (string, error) {
	classes := lease.DefaultOperationClasses()
	if oc := req.Identity.OperationClass; oc != "" && oc != lease.DefaultComponent {
		c, err := lease.NewOperationClasses(oc)
		if err != nil {
			return "", err
		}
		classes = c
	}
	_, p, err := lease.PrepareCommit(req, lease.StoreOptions{OperationClasses: classes})
	if err != nil {
		return "", err
	}
	return lease.OutboxMessageID(p.Scope), nil
}
