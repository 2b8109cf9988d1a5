package service

import (
	"context"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Config.PublishExchanges: a publication naming an exchange outside the
// list is refused access_denied, audited as a rejected commit, before the
// store sees it (nothing appended, the commit id unused); nil allows every
// exchange; a name no publication could use is a configuration error.
func TestPublishExchanges(t *testing.T) {
	ctx := context.Background()
	for _, bad := range [][]string{{"a b"}, {"(default)"}, {"x", "star_sk_v1_x"}} {
		if _, err := New(nil, &audittest.Recorder{}, Options{Config: Config{PublishExchanges: bad}}); err == nil {
			t.Errorf("publish exchanges %q accepted", bad)
		}
	}
	sink := &audittest.Recorder{}
	s, store := newService(t, sink, Config{PublishExchanges: []string{"", "results"}})
	open, _ := newService(t, &audittest.Recorder{}, Config{})
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	publish := func(s *Service, l *lease.Record, commitID, exchange string) error {
		_, err := s.AuthorizeCommit(ctx, call(holder), CommitInput{Identity: target, LeaseID: l.LeaseID, FencingToken: l.FencingToken,
			ServiceInstanceID: "inst-1", Sink: "rabbitmq", CommitID: commitID, ExecutionID: "exec-1", JobID: "job-1",
			Outbox: &lease.OutboxMessage{Exchange: exchange, RoutingKey: "q", Body: []byte("x")}})
		return err
	}
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []string{"", "results"} {
		if err := publish(s, got.Lease, "c-"+x, x); err != nil {
			t.Fatalf("exchange %q: %v", x, err)
		}
	}
	err = publish(s, got.Lease, "c-refused", "documents")
	le := lease.AsError(err)
	if le.Code != lease.CodeAccessDenied || !le.PublicReason || le.Reason != "outbox.exchange is not an exchange this server publishes to" {
		t.Fatalf("exchange outside the list: %+v", le)
	}
	if u, err := store.(lease.OutboxMeter).OutboxUsage(ctx); err != nil || u.Pending != 2 {
		t.Fatalf("outbox after the refusal: %+v %v", u, err)
	}
	rejected := sink.OfType(audit.EventCommitRejected)
	if len(rejected) != 1 || rejected[0].ResultCode != lease.CodeAccessDenied {
		t.Fatalf("the refusal must be audited as a rejected commit: %+v", rejected)
	}
	// The commit id is unused: naming an allowed exchange it is accepted.
	if err := publish(s, got.Lease, "c-refused", ""); err != nil {
		t.Fatalf("the refused commit id with an allowed exchange: %v", err)
	}
	// Without the list, any exchange.
	other, err := open.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	if err := publish(open, other.Lease, "c-any", "documents"); err != nil {
		t.Fatalf("without --publish-exchanges: %v", err)
	}
}
