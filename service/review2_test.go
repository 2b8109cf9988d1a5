package service

// Outside review (i11b) of the administrator reason/incident redaction
// (c1bbc7c) and of the throttled-publication replay (00fbcb3, 0bb0860).

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
)

func review2Service(t *testing.T, sink audit.Sink, red *audit.Redactor, logs *bytes.Buffer, cfg Config) (*Service, lease.Store) {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	o := Options{Config: cfg, Redactor: red}
	if logs != nil {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s, err := New(store, sink, o)
	if err != nil {
		t.Fatal(err)
	}
	return s, store
}

func review2Redactor(t *testing.T) *audit.Redactor {
	t.Helper()
	r, err := audit.NewRedactor(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type review2Env struct {
	s      *Service
	sink   *audittest.Recorder
	holder auth.Principal
	admin  auth.Principal
	reader auth.Principal
}

func newReview2Env(t *testing.T, red *audit.Redactor, logs *bytes.Buffer) *review2Env {
	sink := &audittest.Recorder{}
	s, _ := review2Service(t, sink, red, logs, Config{})
	return &review2Env{s: s, sink: sink,
		holder: principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease),
		admin:  principal(t, "prn-admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease),
		reader: principal(t, "prn-reader3", auth.ClassAPIClient, "tenant:*,program:*", auth.CapAuditRead, auth.CapRead)}
}

func (e *review2Env) acquire(t *testing.T, id lease.Identity) *lease.Record {
	t.Helper()
	got, err := e.s.Acquire(context.Background(), call(e.holder), acquireInput(id))
	if err != nil {
		t.Fatal(err)
	}
	return got.Lease
}

// Attack 1a: with the server's keyed redactor, a retry under the same
// request id with a DIFFERENT secret-shaped reason is a different request
// (idempotency_conflict), not a replay of the first.
func TestReview2AdminDifferentSecretSameRequestIDConflictsKeyed(t *testing.T) {
	review2DifferentSecretConflicts(t, review2Redactor(t))
}

// Attack 1b: the same with a nil Redactor (service.Options.Redactor unset:
// not reachable through "starlease serve", which always builds a keyed one,
// but reachable for any Go caller of service.New). Both secrets become the
// bare "redacted", so the second, different request is answered as a
// replay of the first.
func TestReview2AdminDifferentSecretSameRequestIDConflictsNilRedactor(t *testing.T) {
	review2DifferentSecretConflicts(t, nil)
}

func review2DifferentSecretConflicts(t *testing.T, red *audit.Redactor) {
	ctx := context.Background()
	e := newReview2Env(t, red, nil)
	for _, field := range []string{"reason", "incident_id"} {
		t.Run(field, func(t *testing.T) {
			rec := e.acquire(t, target)
			c := call(e.admin)
			in := AdminInput{Identity: target, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken}
			first, second := in, in
			if field == "reason" {
				first.Reason, second.Reason = "leaked: Bearer aaaa", "leaked: Bearer bbbb"
			} else {
				first.IncidentID, second.IncidentID = "inc-"+strings.Repeat("a", 64), "inc-"+strings.Repeat("b", 64)
			}
			if _, err := e.s.Revoke(ctx, c, first); err != nil {
				t.Fatal(err)
			}
			res, err := e.s.Revoke(ctx, c, second)
			if code(err) != lease.CodeIdempotencyConflict {
				t.Fatalf("same request id, different secret-shaped %s: %v replayed=%v %v; want idempotency_conflict",
					field, res.Code, res.Replayed, err)
			}
			// The identical retry replays.
			if again, err := e.s.Revoke(ctx, c, first); err != nil || !again.Replayed {
				t.Fatalf("identical retry: %v %v", again.Code, err)
			}
		})
	}
}

// Attack 1c: values redaction makes valid. A reason over 512 bytes or with
// a control character, or an incident id with a space, is refused when it
// holds no secret; holding "bearer " it is redacted and accepted. Whatever
// the policy, the terminal record and both audit events must then hold the
// same value: an admin action whose record has a reason must not be
// audited with none.
func TestReview2AdminRedactedValueAuditedLikeRecord(t *testing.T) {
	ctx := context.Background()
	red := review2Redactor(t)
	for _, tc := range []struct {
		name             string
		reason, incident string
	}{
		{"overlong reason with bearer", "Bearer " + strings.Repeat("x", 600), ""},
		{"reason with newline and bearer", "line1\nBearer abc", ""},
		{"incident id with a space and bearer", "", "Bearer abc"},
		{"incident id with star_sk_", "", "star_sk_v1_x"},
		{"both, valid shapes", "key: STAR_SK_abc", "inc-" + strings.Repeat("F", 64)},
		{"valid reason, incident id with a space and bearer", "stuck worker", "Bearer abc"},
		{"valid incident id, overlong reason with bearer", "Bearer " + strings.Repeat("x", 600), "inc-7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newReview2Env(t, red, nil)
			rec := e.acquire(t, target)
			res, err := e.s.Revoke(ctx, call(e.admin), AdminInput{Identity: target, LeaseID: rec.LeaseID,
				FencingToken: rec.FencingToken, Reason: tc.reason, IncidentID: tc.incident})
			if err != nil {
				// Refusing the value is a policy (400 on the field); a 503
				// "audit is unavailable" for a caller's value is not.
				if code(err) != lease.CodeInvalidRequest {
					t.Fatalf("refused with %v; want accepted, or invalid_lease_request", err)
				}
				if strings.Contains(err.Error(), "abc") || strings.Contains(err.Error(), "xxxx") {
					t.Fatalf("the refusal echoes the value: %v", err)
				}
				return
			}
			h, err := e.s.History(ctx, call(e.reader), res.Lease.LeaseID, 10, "")
			if err != nil || len(h.Entries) != 1 {
				t.Fatalf("history: %+v %v", h, err)
			}
			en := h.Entries[0]
			if tc.reason != "" && en.Reason != red.Value(tc.reason) || tc.incident != "" && en.IncidentID != red.Value(tc.incident) {
				t.Fatalf("record reason %q incident %q, want the keyed forms", en.Reason, en.IncidentID)
			}
			evs := e.sink.OfType(audit.EventRevoke)
			if len(evs) != 2 {
				t.Fatalf("%d revoke events, want 2", len(evs))
			}
			for i, ev := range evs {
				if ev.Reason != en.Reason || ev.IncidentID != en.IncidentID {
					t.Errorf("event %d (%s) audits reason %q incident %q; the record holds reason %q incident %q",
						i, ev.ResultCode, ev.Reason, ev.IncidentID, en.Reason, en.IncidentID)
				}
			}
		})
	}
}

// Attack 1d: near misses are stored as given (they are not secret-shaped)
// and are consistent everywhere; upper-case BEARER and STAR_SK_ are
// redacted. Nothing raw that is secret-shaped reaches record or events.
func TestReview2AdminNearMisses(t *testing.T) {
	ctx := context.Background()
	red := review2Redactor(t)
	hex63 := strings.Repeat("a", 63)
	for _, tc := range []struct {
		reason   string
		redacted bool
	}{
		{"digest " + hex63, false},
		{"split " + strings.Repeat("ab", 16) + "-" + strings.Repeat("cd", 16), false},
		{"fullwidth " + strings.Repeat("\uff11", 64), false},
		{"arabic-indic " + strings.Repeat("\u0661", 64), false},
		{"BEARER abc", true},
		{"bEaReR abc", true},
		{"Star_Sk_abc", true},
		{"run " + strings.Repeat("A", 64), true},
		{"redacted:" + strings.Repeat("0", 32), true}, // a forged redaction is hashed
	} {
		e := newReview2Env(t, red, nil)
		rec := e.acquire(t, target)
		res, err := e.s.ForceRelease(ctx, call(e.admin), AdminInput{Identity: target, LeaseID: rec.LeaseID,
			FencingToken: rec.FencingToken, Reason: tc.reason})
		if err != nil {
			t.Fatalf("%q: %v", tc.reason, err)
		}
		h, err := e.s.History(ctx, call(e.reader), res.Lease.LeaseID, 10, "")
		if err != nil || len(h.Entries) != 1 {
			t.Fatalf("history: %v", err)
		}
		got := h.Entries[0].Reason
		want := tc.reason
		if tc.redacted {
			want = red.Value(tc.reason)
			if want == tc.reason {
				t.Fatalf("%q: the redactor keeps it", tc.reason)
			}
		}
		if got != want {
			t.Errorf("%q stored as %q, want %q", tc.reason, got, want)
		}
		for _, ev := range e.sink.OfType(audit.EventForceRelease) {
			if ev.Reason != got {
				t.Errorf("%q audited as %q, stored as %q", tc.reason, ev.Reason, got)
			}
		}
	}
}

// Attack 1e: the raw secret reaches no log line and no error, even when
// the audit sink fails (the error paths log) and when the store refuses.
func TestReview2AdminSecretNotInLogsOrErrors(t *testing.T) {
	ctx := context.Background()
	red := review2Redactor(t)
	secret := "star_sk_v1_01J00000000000000000000000_" + strings.Repeat("cd", 32)
	var logs bytes.Buffer
	sink := &sinkFailingAfter{}
	sink.ok.Store(1) // the acquire's event
	s, _ := review2Service(t, sink, red, &logs, Config{})
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	admin := principal(t, "prn-admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	for _, in := range []AdminInput{
		{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, Reason: "Bearer " + secret},
		{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken + 7, IncidentID: secret},
		{Identity: target, LeaseID: "bad lease id", FencingToken: 1, Reason: "x " + secret},
	} {
		c := call(admin)
		c.CorrelationID = "corr-" + strings.Repeat("e", 64)
		if _, err := s.Revoke(ctx, c, in); err != nil {
			errs = append(errs, err.Error())
		}
	}
	all := logs.String() + strings.Join(errs, "\n")
	for _, ev := range sink.Events() {
		all += ev.Reason + ev.IncidentID
	}
	if strings.Contains(all, strings.Repeat("cd", 32)) || strings.Contains(strings.ToLower(all), "star_sk_") {
		t.Fatalf("the raw secret shows in logs or errors:\n%s", all)
	}
}

// Attack 3: while the principal's bucket is empty, nothing but a replay
// of the principal's own accepted publication gets through, and nothing
// is written: a changed body or routing key is idempotency_conflict,
// another principal's commit id, another identity or another sink is
// 429, a new commit id is 429; the outbox and commit sequence are
// untouched.
func TestReview2ThrottledPublicationOnlyReplays(t *testing.T) {
	ctx := context.Background()
	sink := &audittest.Recorder{}
	s, store := review2Service(t, sink, review2Redactor(t), nil, Config{PrincipalRate: 1e-3, PrincipalBurst: 3})
	p := principal(t, "prn-pub1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	q := principal(t, "prn-pub2", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	other := target
	other.TargetID = "other.example"
	got, err := s.Acquire(ctx, call(p), acquireInput(target)) // p: 2 left
	if err != nil {
		t.Fatal(err)
	}
	got2, err := s.Acquire(ctx, call(p), acquireInput(other)) // p: 1 left
	if err != nil {
		t.Fatal(err)
	}
	in := CommitInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "rabbitmq", CommitID: "pub-1", ExecutionID: "exec-1", JobID: "job-1",
		Outbox: &lease.OutboxMessage{RoutingKey: "q", Body: []byte("result")}}
	first, err := s.AuthorizeCommit(ctx, call(p), in) // p: 0 left
	if err != nil {
		t.Fatal(err)
	}
	// q exhausts its own bucket on acquires of a third identity.
	third := target
	third.TargetID = "third.example"
	q3, err := s.Acquire(ctx, call(q), acquireInput(third))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		x := acquireInput(third)
		x.ServiceInstanceID = "inst-q"
		_, _ = s.Acquire(ctx, call(q), x)
	}
	changedBody, changedKey, otherIdentity, otherSink, fresh := in, in, in, in, in
	changedBody.Outbox = &lease.OutboxMessage{RoutingKey: "q", Body: []byte("forged")}
	changedKey.Outbox = &lease.OutboxMessage{RoutingKey: "q-other", Body: []byte("result")}
	otherIdentity.Identity, otherIdentity.LeaseID, otherIdentity.FencingToken = other, got2.Lease.LeaseID, got2.Lease.FencingToken
	otherSink.Sink = "rabbitmq2"
	fresh.CommitID = "pub-2"
	qIn := in
	qIn.Identity, qIn.LeaseID, qIn.FencingToken = third, q3.Lease.LeaseID, q3.Lease.FencingToken
	for _, tc := range []struct {
		name string
		who  auth.Principal
		in   CommitInput
		want lease.Code
	}{
		{"changed body", p, changedBody, lease.CodeIdempotencyConflict},
		{"changed routing key", p, changedKey, lease.CodeIdempotencyConflict},
		{"another identity, same commit id", p, otherIdentity, lease.CodeRateLimited},
		{"another sink", p, otherSink, lease.CodeRateLimited},
		{"a new commit id", p, fresh, lease.CodeRateLimited},
		{"another principal presenting p's exact publication", q, in, lease.CodeIdempotencyConflict},
		{"another principal, its own identity, p's commit id", q, qIn, lease.CodeRateLimited},
	} {
		res, err := s.AuthorizeCommit(ctx, call(tc.who), tc.in)
		if code(err) != tc.want {
			t.Errorf("%s: %v replayed=%v %v, want %s", tc.name, res.Code, res.Replayed, err, tc.want)
		}
	}
	again, err := s.AuthorizeCommit(ctx, call(p), in)
	if err != nil || !again.Replayed || again.Commit != first.Commit {
		t.Fatalf("throttled retry of the accepted publication: %+v %v, want its replay", again, err)
	}
	pending, err := store.(lease.Outbox).OutboxPending(ctx, 0)
	if err != nil || len(pending) != 1 || pending[0].MessageID != first.Commit.Target {
		t.Fatalf("outbox: %d entries %v, want the accepted publication alone", len(pending), err)
	}
	// The store's sequence was not advanced: a direct commit gets seq+1.
	direct := lease.CommitRequest{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "couchdb", CommitID: "doc-1", ExecutionID: "exec-1", JobID: "job-1",
		Target: "doc:1", Caller: p.Caller("corr"), DeadlineAt: time.Now().Add(time.Minute)}
	d, err := store.AuthorizeCommit(ctx, direct)
	if err != nil || d.Commit.Seq != first.Commit.Seq+1 {
		t.Fatalf("direct commit seq %d (%v), want %d", d.Commit.Seq, err, first.Commit.Seq+1)
	}
}
