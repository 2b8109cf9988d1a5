//go:build linux

package scenario

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
	"github.com/starintel/starlease/valkey"
)

// The actor is this test binary re-executed with actorEnv=1: TestMain runs
// actorMain instead of the tests. It is a leased StarIntel actor reduced to
// what the scenario observes. Its configuration comes in configEnv (JSON);
// it talks to the test on stdout, one JSON line per event, and takes
// commands on stdin. Its own logs (the executor's, the store's) go to
// stderr.
const (
	actorEnv  = "STARLEASE_SCENARIO_ACTOR"
	configEnv = "STARLEASE_SCENARIO_CONFIG"
)

// actorConfig is what the test hands an actor.
type actorConfig struct {
	// Name is the actor's name ("a", "b"): its service instance, execution
	// and commit ids derive from it.
	Name       string         `json:"name"`
	RedisAddr  string         `json:"redis_addr"`
	KeyPrefix  string         `json:"key_prefix"`
	CouchURL   string         `json:"couch_url"`
	CouchDB    string         `json:"couch_db"`
	CouchSink  string         `json:"couch_sink"`
	ResultName string         `json:"result_name"`
	Queue      string         `json:"queue"`
	Identity   lease.Identity `json:"identity"`
	TTLMs      int64          `json:"ttl_ms"`
	// PreAuthorize makes the actor authorize one CouchDB commit while it
	// holds the lease, keep the guard, and write with it only after the
	// "write" command (attempt couchdb_stale).
	PreAuthorize bool `json:"pre_authorize"`
}

// Event kinds an actor prints.
const (
	evHolding = "holding"
	evAttempt = "attempt"
	evCause   = "cause"
	evDone    = "done"
	evFatal   = "fatal"
)

// Attempt names.
const (
	attemptCouch        = "couchdb_write"   // fence.Write through the couchdb writer
	attemptPublish      = "rabbit_publish"  // rabbitmq.Publish into the fenced outbox
	attemptPreAuthorize = "couchdb_preauth" // fence.Committer.Authorize, before the pause
	attemptStaleGuard   = "couchdb_stale"   // the Writer's conditional write with that guard
)

// event is one line an actor prints.
type event struct {
	Event string `json:"event"`
	Actor string `json:"actor"`
	PID   int    `json:"pid,omitempty"`

	// holding
	LeaseID      string `json:"lease_id,omitempty"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	LockKey      string `json:"lock_key,omitempty"`
	ExecutionID  string `json:"execution_id,omitempty"`
	ExpiresAt    string `json:"expires_at,omitempty"`

	// attempt
	Attempt   string          `json:"attempt,omitempty"`
	OK        bool            `json:"ok,omitempty"`
	Code      lease.Code      `json:"code,omitempty"`
	Error     string          `json:"error,omitempty"`
	CommitID  string          `json:"commit_id,omitempty"`
	Guard     *fence.Guard    `json:"guard,omitempty"`
	MessageID string          `json:"message_id,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	// CouchKind is the couchdb.Error kind of a CouchDB failure ("" if the
	// write never reached CouchDB).
	CouchKind string `json:"couch_kind,omitempty"`
	// LossCalls counts the publisher's loss-handler calls.
	LossCalls int `json:"loss_calls,omitempty"`

	// cause
	Cause            string `json:"cause,omitempty"`
	Sentinel         string `json:"sentinel,omitempty"`
	LeaseLoss        bool   `json:"lease_loss,omitempty"`
	CtxDoneAtCommand bool   `json:"ctx_done_at_command,omitempty"`
	CauseAtCommand   string `json:"cause_at_command,omitempty"`
	// CancelledAfterCmd is when the work context ended relative to the
	// "write" command (negative: before it).
	CancelledAfterCmd string `json:"cancelled_after_command,omitempty"`

	// done
	RunError string `json:"run_error,omitempty"`
}

// resultData is the content an actor writes and publishes: everything
// names its writer, so the test can tell whose content it reads back.
type resultData struct {
	Holder       string `json:"holder"`
	LeaseID      string `json:"lease_id"`
	FencingToken uint64 `json:"fencing_token"`
	ExecutionID  string `json:"execution_id"`
	Finding      string `json:"finding"`
}

var sentinels = []struct {
	name string
	err  error
}{
	{"ErrLeaseExpired", executor.ErrLeaseExpired},
	{"ErrRenewalRejected", executor.ErrRenewalRejected},
	{"ErrLeaseLost", executor.ErrLeaseLost},
	{"ErrBackendUnavailable", executor.ErrBackendUnavailable},
	{"ErrReleased", executor.ErrReleased},
	{"ErrRevoked", executor.ErrRevoked},
	{"ErrWorkDone", executor.ErrWorkDone},
}

func sentinelOf(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	if err == nil {
		return ""
	}
	return "other"
}

var couchKinds = []struct {
	name string
	err  error
}{
	{"ErrFenceRejected", couchdb.ErrFenceRejected},
	{"ErrConflict", couchdb.ErrConflict},
	{"ErrNotFound", couchdb.ErrNotFound},
	{"ErrUnavailable", couchdb.ErrUnavailable},
	{"ErrOutcomeUnknown", couchdb.ErrOutcomeUnknown},
	{"ErrAccessDenied", couchdb.ErrAccessDenied},
	{"ErrInvalid", couchdb.ErrInvalid},
	{"ErrFenceMissing", couchdb.ErrFenceMissing},
	{"ErrCorrupt", couchdb.ErrCorrupt},
}

func couchKindOf(err error) string {
	var ce *couchdb.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, k := range couchKinds {
		if errors.Is(ce.Kind, k.err) {
			return k.name
		}
	}
	return "unknown"
}

// emitter prints events as JSON lines on stdout.
type emitter struct {
	mu   sync.Mutex
	name string
	out  io.Writer
}

func (e *emitter) emit(ev event) {
	ev.Actor = e.name
	ev.PID = os.Getpid()
	b, err := json.Marshal(ev)
	if err != nil {
		b, _ = json.Marshal(event{Event: evFatal, Actor: e.name, Error: "encode event: " + err.Error()})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.out, "%s\n", b)
}

// actorMain runs one actor and returns its exit code.
func actorMain() int {
	var cfg actorConfig
	if err := json.Unmarshal([]byte(os.Getenv(configEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "actor: bad %s: %v\n", configEnv, err)
		return 2
	}
	em := &emitter{name: cfg.Name, out: os.Stdout}
	if err := runActor(cfg, em, bufio.NewScanner(os.Stdin)); err != nil {
		em.emit(event{Event: evFatal, Error: err.Error()})
		return 1
	}
	return 0
}

func runActor(cfg actorConfig, em *emitter, stdin *bufio.Scanner) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).
		With("actor", cfg.Name, "pid", os.Getpid())
	ctx := context.Background()

	octx, cancel := context.WithTimeout(ctx, 15*time.Second)
	store, err := valkey.Open(octx, valkey.Options{Addr: cfg.RedisAddr, KeyPrefix: cfg.KeyPrefix, ReapInterval: -1,
		StoreOptions: lease.StoreOptions{Logger: logger}})
	cancel()
	if err != nil {
		return fmt.Errorf("valkey.Open: %w", err)
	}
	defer store.Close()

	db, err := couchdb.New(cfg.CouchURL, cfg.CouchDB)
	if err != nil {
		return fmt.Errorf("couchdb.New: %w", err)
	}
	writer, err := db.Writer(cfg.CouchSink)
	if err != nil {
		return fmt.Errorf("couchdb writer: %w", err)
	}
	results := couchdb.NewResults(writer)

	caller := lease.Caller{PrincipalID: "prn-scenario-actor", ClientID: "client-" + cfg.Name, CredentialID: "key-" + cfg.Name}
	spec := executor.Spec{
		Identity:          cfg.Identity,
		ServiceInstanceID: "instance-" + cfg.Name,
		ExecutionID:       "exec-" + cfg.Name,
		JobID:             "job-scenario",
		TraceID:           "trace-" + cfg.Name,
		Caller:            caller,
		TTL:               time.Duration(cfg.TTLMs) * time.Millisecond,
		Logger:            logger,
	}

	runErr := executor.Run(ctx, store, spec, func(wctx context.Context, l *executor.Lease) error {
		// When the work context ends, for the report.
		var cancelledAt atomic.Pointer[time.Time]
		stopAfter := context.AfterFunc(wctx, func() { now := time.Now(); cancelledAt.Store(&now) })
		defer stopAfter()
		rec := l.Record()
		data := resultData{Holder: cfg.Name, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
			ExecutionID: rec.ExecutionID, Finding: "open ports found by " + cfg.Name}
		dataJSON, _ := json.Marshal(data)
		// Commits use contexts of their own: cancellation of the work
		// context is advisory, and this actor, like a paused one, carries
		// on regardless. The work context is used for reporting only.
		commitCtx := func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 10*time.Second)
		}

		// While it still holds the lease, the actor may authorize one
		// CouchDB commit and keep the guard without writing: the "checked,
		// then paused before the write" holder.
		var preGuard *fence.Guard
		preCommitID := "commit-" + cfg.Name + "-preauth"
		if cfg.PreAuthorize {
			cctx, ccancel := commitCtx()
			preWrite, berr := results.Bind(couchdb.Result{Identity: cfg.Identity, Name: cfg.ResultName,
				ContentType: "application/json", Data: dataJSON})
			if berr != nil {
				return berr
			}
			pre, perr := l.Committer().Authorize(cctx, writer.Name(), preCommitID, preWrite)
			ccancel()
			ev := event{Event: evAttempt, Attempt: attemptPreAuthorize, CommitID: preCommitID, OK: perr == nil, Code: lease.CodeOf(perr)}
			if perr == nil {
				g := l.Committer().Guard(pre)
				preGuard, ev.Guard = &g, &g
			} else {
				ev.Error = perr.Error()
			}
			em.emit(ev)
		}

		em.emit(event{Event: evHolding, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken, LockKey: rec.LockKey,
			ExecutionID: rec.ExecutionID, ExpiresAt: rec.ExpiresAt.String()})

		// Wait for the test's command.
		cmd, ok := "", stdin.Scan()
		if ok {
			cmd = stdin.Text()
		}
		if cmd != "write" {
			return fmt.Errorf("actor: expected the command \"write\", got %q (stdin open: %v)", cmd, ok)
		}
		commandAt := time.Now()
		doneAtCommand := wctx.Err() != nil
		causeAtCommand := context.Cause(wctx)

		// (1) A fenced CouchDB result document through the couchdb writer.
		cctx, ccancel := commitCtx()
		commitID := "commit-" + cfg.Name + "-couchdb"
		g, werr := fence.Write(cctx, l.Committer(), results, commitID,
			couchdb.Result{Identity: cfg.Identity, Name: cfg.ResultName, ContentType: "application/json", Data: dataJSON})
		ccancel()
		ev := event{Event: evAttempt, Attempt: attemptCouch, CommitID: commitID, OK: werr == nil, Code: lease.CodeOf(werr),
			Body: dataJSON, CouchKind: couchKindOf(werr)}
		if werr != nil {
			ev.Error = werr.Error()
		}
		if g.LeaseID != "" {
			ev.Guard = &g
		}
		em.emit(ev)

		// (2) A fenced Rabbit publication into the outbox.
		cctx, ccancel = commitCtx()
		pubCommitID := "commit-" + cfg.Name + "-rabbit"
		var lossMu sync.Mutex
		lossCalls := 0
		pub := rabbitmq.NewPublisher(store, rabbitmq.WithCaller(caller), rabbitmq.WithLossHandler(func(*lease.Error) {
			lossMu.Lock()
			lossCalls++
			lossMu.Unlock()
		}))
		p, perr2 := pub.Publish(cctx, l.Committer(), pubCommitID, lease.OutboxMessage{Exchange: "", RoutingKey: cfg.Queue,
			ContentType: "application/json", Body: dataJSON})
		ccancel()
		lossMu.Lock()
		ev = event{Event: evAttempt, Attempt: attemptPublish, CommitID: pubCommitID, OK: perr2 == nil, Code: lease.CodeOf(perr2),
			Body: dataJSON, MessageID: p.MessageID, LossCalls: lossCalls}
		lossMu.Unlock()
		if perr2 != nil {
			ev.Error = perr2.Error()
		} else {
			ev.Guard = &p.Guard
		}
		em.emit(ev)

		// (3) The write the guard authorized before the pause, made now:
		// only CouchDB's own conditional write can refuse it.
		if preGuard != nil {
			cctx, ccancel := commitCtx()
			serr := results.Commit(cctx, *preGuard, couchdb.Result{Identity: cfg.Identity, Name: cfg.ResultName,
				ContentType: "application/json", Data: dataJSON})
			ccancel()
			ev = event{Event: evAttempt, Attempt: attemptStaleGuard, CommitID: preCommitID, OK: serr == nil, Code: lease.CodeOf(serr),
				Body: dataJSON, CouchKind: couchKindOf(serr), Guard: preGuard}
			if serr != nil {
				ev.Error = serr.Error()
			}
			em.emit(ev)
		}

		// Report the work context. A holder that kept its lease is not
		// cancelled (nil cause); one that lost it must be, soon: wait a
		// little for it so a cancellation in progress is seen.
		cev := event{Event: evCause, CtxDoneAtCommand: doneAtCommand}
		if causeAtCommand != nil {
			cev.CauseAtCommand = causeAtCommand.Error()
		}
		anyFailed := werr != nil || perr2 != nil
		if anyFailed {
			select {
			case <-wctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
		if c := context.Cause(wctx); c != nil {
			cev.Cause, cev.Sentinel, cev.LeaseLoss = c.Error(), sentinelOf(c), executor.LeaseLoss(c)
			if at := cancelledAt.Load(); at != nil {
				cev.CancelledAfterCmd = at.Sub(commandAt).Round(100 * time.Microsecond).String()
			}
		}
		em.emit(cev)
		return nil
	})
	done := event{Event: evDone}
	if runErr != nil {
		done.RunError = runErr.Error()
		done.Code = lease.CodeOf(runErr)
	}
	em.emit(done)
	return nil
}
