package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

const outboxUsage = `usage:
  starlease outbox dead-letters --data-dir DIR [--limit N] [--bodies]
  starlease outbox requeue      --data-dir DIR --message-id ID --reason TEXT
  starlease outbox discard      --data-dir DIR --message-id ID --reason TEXT

  any of them with --backend valkey [--valkey-addr HOST:PORT --valkey-username U
  --valkey-password-file F --valkey-key-prefix P --valkey-tls-ca-file F] or
  --backend etcd [--etcd-endpoints URL,... --etcd-username U --etcd-password-file F
  --etcd-key-prefix P --etcd-tls-ca-file F] instead of --data-dir

The relay sets aside a publication the broker refuses for a reason retrying
will not cure (no such exchange, access refused, nacked or returned again
and again) as a dead letter, and relays the next ones. At most 10000 are
kept; past that a poison publication stays pending and holds back every
later one until an operator makes room.

dead-letters prints the count and up to --limit dead letters, oldest
first: message id, reason, when, the lease and identity that published it,
and the message (its body as bytes and SHA-256 unless --bodies).
requeue, once the cause is cured (the exchange declared, the permission
granted), moves a dead letter back to the relay, after every pending
publication, unchanged; it is refused while the pending outbox is full.
discard removes one for good; a damaged dead letter (its stored value does
not decode, or its entry is gone) is listed as such, named damaged_<key>
if its message id cannot be read, and can only be discarded. Each prints the dead letter it acted on and
is a durable, high-priority audit event (outbox_dead_letter_requeued,
outbox_dead_letter_discarded) in the server's audit store, written before
success is reported, with --reason.

bolt: bbolt admits one process per store file, so run it with "starlease
serve" on DIR stopped. valkey and etcd: with the servers running, on the
namespace or key prefix they serve. Flags can also be set as
STARLEASE_<FLAG>.
`

// operatorPrincipal is recorded as the principal of an outbox command's
// audit events: the command runs with the backend's own access, not an API
// key.
const operatorPrincipal = "starlease-operator"

func runOutbox(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "dead-letters" && args[0] != "requeue" && args[0] != "discard") {
		fmt.Fprint(stderr, outboxUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	fs := usageFlagSet("starlease outbox "+sub, outboxUsage, stderr)
	dataDir := fs.String("data-dir", "", "data directory of the server (required with --backend bolt)")
	var bf backendFlags
	bf.register(fs)
	limit := fs.Int("limit", 100, "dead-letters: at most this many, oldest first")
	bodies := fs.Bool("bodies", false, "dead-letters: print each message's body (standard base64)")
	messageID := fs.String("message-id", "", "requeue, discard: the dead letter's message id")
	reason := fs.String("reason", "", "requeue, discard: why, for the audit trail (required)")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of the command")
	if code, ok := parseBackendCommand(fs, rest, &bf, dataDir, outboxUsage, stderr); !ok {
		return code
	}
	if sub != "dead-letters" {
		if err := lease.CheckOpaqueID("message_id", *messageID); err != nil {
			return fail(stderr, err, "")
		}
		if err := lease.CheckReason(*reason); err != nil || strings.TrimSpace(*reason) == "" {
			return fail(stderr, lease.Invalid("reason", "--reason is required: printable text without control or format characters, at most 512 bytes"), "")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, sink, closeAll, err := openOutbox(ctx, bf, *dataDir, log, sub != "dead-letters")
	if err != nil {
		return fail(stderr, err, "")
	}
	defer closeAll()
	if sub == "dead-letters" {
		n, err := st.OutboxDeadLen(ctx)
		if err != nil {
			return fail(stderr, err, "")
		}
		dead, err := st.OutboxDeadLetters(ctx, *limit)
		if err != nil {
			return fail(stderr, err, "")
		}
		shown := make([]deadLetterView, len(dead))
		for i, d := range dead {
			shown[i] = viewDeadLetter(d, *bodies)
		}
		return succeed(stdout, stderr, map[string]any{"code": "outbox_dead_letters", "count": n, "dead_letters": shown})
	}
	act, typ := st.OutboxDiscardDeadLetter, audit.EventOutboxDiscard
	if sub == "requeue" {
		act, typ = st.OutboxRequeueDeadLetter, audit.EventOutboxRequeue
	}
	d, err := act(ctx, *messageID)
	// The event is written even when the command's deadline has passed (an
	// undecided outcome is most often just that), within a bound of its own.
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer acancel()
	if err != nil {
		// Refused (nothing changed) or undecided: recorded either way, so
		// an outcome the command cannot tell still leaves a trace.
		_ = writeOutboxEvent(actx, sink, typ, d, *messageID, *reason, lease.AsError(err))
		return fail(stderr, err, "")
	}
	if err := writeOutboxEvent(actx, sink, typ, d, *messageID, *reason, nil); err != nil {
		return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable,
			"the dead letter was %s but its audit event was not written: %v", outboxVerb(typ), err), "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "dead_letter_" + outboxVerb(typ), "dead_letter": viewDeadLetter(d, false)})
}

// openOutbox opens the store f names and, to record an operator's change,
// the audit store its servers write to (bolt: the audit file in dataDir;
// valkey, etcd: the namespace's stream, with no local spool, so an event
// that cannot be written fails the command).
func openOutbox(ctx context.Context, f backendFlags, dataDir string, log *slog.Logger, audited bool) (lease.OutboxDeadLetterAdmin, audit.Sink, func(), error) {
	opts := lease.StoreOptions{Logger: log}
	var st lease.Store
	var sink audit.Sink
	closers := []func(){}
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	switch f.backend {
	case "valkey":
		o := f.valkeyOptions(opts)
		o.ReapInterval = -1 // one command's life: the servers reap
		vs, err := valkey.Open(ctx, o)
		if err != nil {
			return nil, nil, nil, err
		}
		st, sink = vs, vs.AuditSink(valkey.AuditOptions{})
		closers = append(closers, func() { _ = vs.Close() })
	case "etcd":
		o := f.etcdOptions(opts)
		o.ReapInterval = -1
		es, err := etcd.Open(ctx, o)
		if err != nil {
			return nil, nil, nil, err
		}
		st, sink = es, es.AuditSink(etcd.AuditOptions{})
		closers = append(closers, func() { _ = es.Close() })
	default:
		bs, err := bolt.Open(filepath.Join(dataDir, storeFile), bolt.Options{StoreOptions: opts, ReapInterval: -1})
		if err != nil {
			return nil, nil, nil, withLockedHint(err, "; stop starlease serve on this data directory first (bbolt admits one process)")
		}
		st = bs
		closers = append(closers, func() { _ = bs.Close() })
		if audited {
			as, err := bolt.OpenAudit(filepath.Join(dataDir, bolt.AuditFileName), bolt.AuditOptions{})
			if err != nil {
				closeAll()
				return nil, nil, nil, err
			}
			sink = as
			closers = append(closers, func() { _ = as.Close() })
		}
	}
	admin, ok := st.(lease.OutboxDeadLetterAdmin)
	if !ok {
		closeAll()
		return nil, nil, nil, lease.Errorf(lease.CodeInvalidRequest, "the %s backend keeps no dead letters", f.backend)
	}
	return admin, sink, closeAll, nil
}

// outboxVerb is what an outbox event's change did to the dead letter, as
// its audit reason and the command's result code say it.
func outboxVerb(typ audit.EventType) string {
	if typ == audit.EventOutboxDiscard {
		return "discarded"
	}
	return "requeued"
}

// writeOutboxEvent records an operator's requeue or discard of dead letter
// id: allowed with the dead letter's scope, lease and token, or denied
// with the refusal's code.
func writeOutboxEvent(ctx context.Context, sink audit.Sink, typ audit.EventType, d lease.DeadLetter, id, reason string, refused *lease.Error) error {
	e := audit.NewEvent(typ, time.Now())
	e.PrincipalID, e.Decision = operatorPrincipal, audit.DecisionAllow
	what := outboxVerb(typ)
	detail := fmt.Sprintf("dead letter %s %s: %s", id, what, reason)
	switch {
	case refused != nil && refused.Code == lease.CodeOutcomeUnknown:
		e.Decision = audit.DecisionDeny
		detail = fmt.Sprintf("dead letter %s maybe %s (%s: the outcome is unknown; list the dead letters): %s", id, what, refused.Code, reason)
	case refused != nil:
		e.Decision = audit.DecisionDeny
		detail = fmt.Sprintf("dead letter %s not %s (%s): %s", id, what, refused.Code, reason)
	case d.Damaged != "":
		detail = fmt.Sprintf("dead letter %s (%s) %s: %s", id, d.Damaged, what, reason)
	default:
		en := d.Entry
		e.SetScope(en.Identity)
		e.LeaseID, e.ExecutionID, e.TraceID = en.LeaseID, en.ExecutionID, en.TraceID
		if token := en.FencingToken; token > 0 {
			e.FencingToken = &token
		}
	}
	e.Reason = audit.CutReason(detail)
	return sink.Write(ctx, e)
}

// deadLetterView is a dead letter as the command prints it.
type deadLetterView struct {
	MessageID    string            `json:"message_id"`
	Reason       string            `json:"reason"`
	DeadAt       *lease.Timestamp  `json:"dead_at,omitempty"`
	AcceptedAt   *lease.Timestamp  `json:"accepted_at,omitempty"`
	Identity     lease.Identity    `json:"lock_identity"`
	LeaseID      string            `json:"lease_id"`
	FencingToken uint64            `json:"fencing_token"`
	ExecutionID  string            `json:"execution_id"`
	CommitID     string            `json:"commit_id"`
	Exchange     string            `json:"exchange"`
	RoutingKey   string            `json:"routing_key"`
	ContentType  string            `json:"content_type,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	BodyBytes    int               `json:"body_bytes"`
	BodySHA256   string            `json:"body_sha256,omitempty"`
	Body         []byte            `json:"body,omitempty"`
	// Damaged: only the message id (if readable) and what is printed
	// beside it are known; it can be discarded, not requeued.
	Damaged string `json:"damaged,omitempty"`
}

func viewDeadLetter(d lease.DeadLetter, body bool) deadLetterView {
	en, m := d.Entry, d.Entry.Message
	sum := sha256.Sum256(m.Body)
	v := deadLetterView{MessageID: en.MessageID, Reason: d.Reason,
		Identity: en.Identity, LeaseID: en.LeaseID, FencingToken: en.FencingToken, ExecutionID: en.ExecutionID,
		CommitID: en.CommitID, Exchange: m.Exchange, RoutingKey: m.RoutingKey, ContentType: m.ContentType,
		Headers: m.Headers, BodyBytes: len(m.Body), BodySHA256: hex.EncodeToString(sum[:]), Damaged: d.Damaged}
	if d.Damaged != "" {
		v.BodySHA256 = "" // of nothing known
	}
	// A damaged dead letter may lack either (a time that is not one does
	// not encode).
	if !d.DeadAt.IsZero() {
		v.DeadAt = &d.DeadAt
	}
	if !en.AcceptedAt.IsZero() {
		v.AcceptedAt = &en.AcceptedAt
	}
	if body {
		v.Body = m.Body
	}
	return v
}
