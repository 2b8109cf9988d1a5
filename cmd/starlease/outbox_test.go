package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// deadLettered writes a bolt store in dir holding n publications the relay
// set aside, and returns their message ids, oldest first.
func deadLettered(t *testing.T, dir string, n int) []string {
	t.Helper()
	s, err := bolt.Open(filepath.Join(dir, storeFile), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return setAside(t, s, n)
}

// setAside commits n publications to s and sets each aside as the relay
// does; it returns their message ids, oldest first.
func setAside(t *testing.T, s lease.OutboxDeadLetterAdmin, n int) []string {
	t.Helper()
	ctx := context.Background()
	far := time.Now().Add(time.Minute)
	id := lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target-1", ActorName: "scraper", WorkflowName: "default", OperationClass: "default"}
	caller := lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}
	st := s.(lease.Store)
	a, err := st.Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance-1", TTL: time.Minute,
		MaximumLifetime: time.Hour, ExecutionID: "execution-1", JobID: "job-1",
		Mutation: lease.Mutation{RequestID: "req-1", DeadlineAt: far, Caller: caller}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		m := lease.OutboxMessage{Exchange: "missing", RoutingKey: "q", Body: []byte("result " + string(rune('a'+i))),
			Headers: map[string]string{"x-note": "\u202eevil"}}
		c, err := st.AuthorizeCommit(ctx, lease.CommitRequest{Identity: id, LeaseID: a.Lease.LeaseID,
			FencingToken: a.Lease.FencingToken, ServiceInstanceID: "instance-1", Sink: "rabbitmq",
			CommitID: "commit-" + string(rune('a'+i)), ExecutionID: "execution-1", JobID: "job-1", Outbox: &m,
			DeadlineAt: far, Caller: caller})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.OutboxDeadLetter(ctx, c.Commit.Target, "NOT_FOUND - no exchange 'missing'"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.Commit.Target)
	}
	return ids
}

type printedDeadLetters struct {
	Code        string           `json:"code"`
	Count       int              `json:"count"`
	DeadLetters []deadLetterView `json:"dead_letters"`
}

// outboxEvents reads the audit store's outbox events.
func outboxEvents(t *testing.T, dir string) []audit.Event {
	t.Helper()
	store, err := bolt.OpenAudit(filepath.Join(dir, bolt.AuditFileName), bolt.AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	page, err := store.Read(context.Background(), audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for _, e := range page {
		if e.EventType.OperatorStep() {
			out = append(out, e)
		}
	}
	return out
}

// TestOutboxDeadLettersCommand: an operator lists the dead letters, requeues
// one and discards another; each change is a durable audit event with the
// operator's reason, and refusals change nothing.
func TestOutboxDeadLettersCommand(t *testing.T) {
	dir := t.TempDir()
	ids := deadLettered(t, dir, 3)

	var listed printedDeadLetters
	runCLI(t, "outbox", "dead-letters", "--data-dir", dir, "--limit", "2").ok(t, &listed)
	if listed.Code != "outbox_dead_letters" || listed.Count != 3 || len(listed.DeadLetters) != 2 ||
		listed.DeadLetters[0].MessageID != ids[0] || listed.DeadLetters[1].MessageID != ids[1] {
		t.Fatalf("listed %+v", listed)
	}
	first := listed.DeadLetters[0]
	if first.Body != nil || first.BodyBytes != len("result a") || first.Exchange != "missing" ||
		first.Reason != "NOT_FOUND - no exchange 'missing'" || first.FencingToken != 1 || first.Identity.TenantID != "tenant-a" {
		t.Fatalf("first dead letter %+v", first)
	}
	// The format character a header holds reaches the terminal escaped.
	if r := runCLI(t, "outbox", "dead-letters", "--data-dir", dir); strings.ContainsRune(r.stdout, '\u202e') || !strings.Contains(r.stdout, `\u202e`) {
		t.Fatalf("a format character printed raw or lost:\n%s", r.stdout)
	}
	var withBodies printedDeadLetters
	runCLI(t, "outbox", "dead-letters", "--data-dir", dir, "--bodies").ok(t, &withBodies)
	if string(withBodies.DeadLetters[2].Body) != "result c" {
		t.Fatalf("bodies %+v", withBodies.DeadLetters)
	}

	// Refused, nothing changed: no reason, a blank one, a malformed id,
	// an unknown one.
	for _, args := range [][]string{
		{"--message-id", ids[0]},
		{"--message-id", ids[0], "--reason", "  "},
		{"--message-id", "msg bad", "--reason", "x"},
	} {
		r := runCLI(t, append([]string{"outbox", "requeue", "--data-dir", dir}, args...)...)
		if r.code != exitCode(lease.CodeInvalidRequest) || r.envelope(t).Code != lease.CodeInvalidRequest {
			t.Fatalf("requeue %q: exit %d, %s", args, r.code, r.stderr)
		}
	}
	r := runCLI(t, "outbox", "discard", "--data-dir", dir, "--message-id", "msg_unknown", "--reason", "cleanup")
	if r.envelope(t).Code != lease.CodeNotFound {
		t.Fatalf("discard of an unknown id: %s", r.stderr)
	}

	var requeued struct {
		Code       string         `json:"code"`
		DeadLetter deadLetterView `json:"dead_letter"`
	}
	runCLI(t, "outbox", "requeue", "--data-dir", dir, "--message-id", ids[1], "--reason", "exchange declared (INC-7)").ok(t, &requeued)
	if requeued.Code != "dead_letter_requeued" || requeued.DeadLetter.MessageID != ids[1] {
		t.Fatalf("requeued %+v", requeued)
	}
	var discarded struct {
		Code       string         `json:"code"`
		DeadLetter deadLetterView `json:"dead_letter"`
	}
	runCLI(t, "outbox", "discard", "--data-dir", dir, "--message-id", ids[0], "--reason", "obsolete result").ok(t, &discarded)
	if discarded.Code != "dead_letter_discarded" || discarded.DeadLetter.MessageID != ids[0] {
		t.Fatalf("discarded %+v", discarded)
	}
	runCLI(t, "outbox", "dead-letters", "--data-dir", dir).ok(t, &listed)
	if listed.Count != 1 || len(listed.DeadLetters) != 1 || listed.DeadLetters[0].MessageID != ids[2] {
		t.Fatalf("left %+v", listed)
	}

	// The store read back: the requeued publication is pending again.
	s, err := bolt.Open(filepath.Join(dir, storeFile), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	pending, err := s.OutboxPending(context.Background(), 10)
	s.Close()
	if err != nil || len(pending) != 1 || pending[0].MessageID != ids[1] || string(pending[0].Message.Body) != "result b" {
		t.Fatalf("pending %+v, %v", pending, err)
	}

	events := outboxEvents(t, dir)
	want := []struct {
		typ      audit.EventType
		decision audit.Decision
		reason   string
	}{
		{audit.EventOutboxDiscard, audit.DecisionDeny, "dead letter msg_unknown not discarded (lease_not_found): cleanup"},
		{audit.EventOutboxRequeue, audit.DecisionAllow, "dead letter " + ids[1] + " requeued: exchange declared (INC-7)"},
		{audit.EventOutboxDiscard, audit.DecisionAllow, "dead letter " + ids[0] + " discarded: obsolete result"},
	}
	if len(events) != len(want) {
		b, _ := json.Marshal(events)
		t.Fatalf("outbox audit events %s", b)
	}
	for i, w := range want {
		e := events[i]
		if e.EventType != w.typ || e.Decision != w.decision || e.Reason != w.reason || e.Priority != audit.PriorityHigh ||
			e.PrincipalID != operatorPrincipal {
			t.Fatalf("event %d: %+v; want %+v", i, e, w)
		}
		if w.decision == audit.DecisionAllow && (e.TenantID != "tenant-a" || e.LeaseID == "" || e.FencingToken == nil || *e.FencingToken != 1) {
			t.Fatalf("event %d lacks the dead letter's scope: %+v", i, e)
		}
	}
}

// TestOutboxCommandRefusesWhileServing: bbolt admits one process; the
// command says to stop the server rather than waiting or failing vaguely.
func TestOutboxCommandRefusesWhileServing(t *testing.T) {
	dir := t.TempDir()
	deadLettered(t, dir, 1)
	s, err := bolt.Open(filepath.Join(dir, storeFile), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := runCLI(t, "outbox", "dead-letters", "--data-dir", dir, "--timeout", "3s")
	if e := r.envelope(t); e.Code != lease.CodeBackendUnavailable || !strings.Contains(e.Reason, "stop starlease serve") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

// TestOutboxCommandOnValkey: with --backend valkey the command acts on the
// namespace the servers share, while they run, and its audit event is in
// the namespace's stream.
func TestOutboxCommandOnValkey(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const prefix = "starlease:outboxcmd"
	vs, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: prefix, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	ids := setAside(t, vs, 2)
	flags := []string{"--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-key-prefix", prefix}

	var listed printedDeadLetters
	runCLI(t, append([]string{"outbox", "dead-letters"}, flags...)...).ok(t, &listed)
	if listed.Count != 2 || len(listed.DeadLetters) != 2 || listed.DeadLetters[0].MessageID != ids[0] {
		t.Fatalf("listed %+v", listed)
	}
	var done struct {
		Code string `json:"code"`
	}
	runCLI(t, append([]string{"outbox", "requeue", "--message-id", ids[0], "--reason", "exchange declared"}, flags...)...).ok(t, &done)
	runCLI(t, append([]string{"outbox", "discard", "--message-id", ids[1], "--reason", "obsolete"}, flags...)...).ok(t, &done)
	if pending, err := vs.OutboxPending(ctx, 10); err != nil || len(pending) != 1 || pending[0].MessageID != ids[0] {
		t.Fatalf("pending %+v, %v", pending, err)
	}
	if n, err := vs.OutboxDeadLen(ctx); err != nil || n != 0 {
		t.Fatalf("dead letters %d, %v", n, err)
	}
	stream, err := vs.AuditSink(valkey.AuditOptions{}).Read(ctx, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range stream {
		if e.EventType.OperatorStep() && e.Decision == audit.DecisionAllow && e.PrincipalID == operatorPrincipal {
			got = append(got, e.Reason)
		}
	}
	want := []string{"dead letter " + ids[0] + " requeued: exchange declared", "dead letter " + ids[1] + " discarded: obsolete"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("outbox events in the stream %q, want %q", got, want)
	}
}
