package executor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// TestPartitionFailsClosed is the partition test of the executor, end to
// end: the real "starlease serve" (bolt backend) in its own process, an
// executor whose only link to it runs through a fault-injecting proxy
// (toxiproxy, loopback), and a partition that cuts that link mid-work by
// dropping every byte in both directions.
//
// It shows, in order:
//  1. while partitioned, the holder's commit authorization fails closed (no
//     success: outcome unknown), and no renewal succeeds — neither locally
//     nor at the server, whose expires_at stays the last renewal's;
//  2. the work context is cancelled with a lease-loss cause
//     (ErrBackendUnavailable) before the lease expires at the backend: an
//     inspection over a direct link, sent after the cancellation, still
//     finds the lease active (the backend's own answer, no clock
//     comparison), and polling until the backend reports it expired bounds
//     the margin;
//  3. once the link is back, nothing the holder writes is accepted: its
//     commit is lease_lost (the lease expired at the backend), a successor
//     acquires with a higher token over a direct link and commits, the
//     holder's next commit is lease_lost again, and the fenced store holds
//     only the successor's write.
func TestPartitionFailsClosed(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	srv := testenv.StartStarlease(t, bin, "--backend", "bolt")
	// api_client principals with targets:lease in tenant-a/program-a.
	createKey := func(principal string) string {
		key, _ := srv.CreateKey(principal, "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
		return key
	}
	holderKey := createKey("prn-holder")
	successorKey := createKey("prn-successor")
	proxy := testenv.StartProxy(t, srv.Addr())

	newClient := func(base, key string) *client.Client {
		c, err := client.New(base, key)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The holder reaches the server only through the proxy; the observer
	// (the holder's principal, so it may read the lease) and the successor
	// have direct links.
	holderStore := client.NewLeaseStore(newClient("http://"+proxy.Addr(), holderKey), "prn-holder")
	observer := newClient(srv.URL(), holderKey)
	successorStore := client.NewLeaseStore(newClient(srv.URL(), successorKey), "prn-successor")

	sink := fencetest.NewMemorySink("scan-results")
	id := lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "web",
		TargetID: "example.com", ActorName: "portscan"}
	const ttl = 4 * time.Second // margin ttl/3: cancellation ~0.7 s before expiry, room for a loaded CI machine
	specFor := func(instance string) executor.Spec {
		return executor.Spec{Identity: id, ServiceInstanceID: instance, ExecutionID: "exec-" + instance,
			JobID: "job-1", TraceID: "trace-" + instance, TTL: ttl,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})).With("instance", instance)}
	}

	type cancellation struct {
		at    time.Time
		cause error
	}
	var (
		acquired        = make(chan *executor.Lease, 1)
		partitioned     = make(chan struct{})
		partitionCommit = make(chan error, 1)
		cancelled       = make(chan cancellation, 1)
		tryWrite        = make(chan string)
		wrote           = make(chan error)
		runDone         = make(chan error, 1)
	)
	go func() {
		runDone <- executor.Run(t.Context(), holderStore, specFor("holder"), func(ctx context.Context, l *executor.Lease) error {
			acquired <- l
			select {
			case <-partitioned:
			case <-ctx.Done():
				return context.Cause(ctx) // lost before the partition: the test fails below
			}
			// A commit while partitioned.
			_, err := l.Committer().Authorize(ctx, sink.Name(), "holder-during-partition",
				fence.Binding{Target: "example.com", PayloadSHA256: strings.Repeat("0", 64)})
			partitionCommit <- err
			<-ctx.Done()
			cancelled <- cancellation{time.Now(), context.Cause(ctx)}
			// Cancellation is advisory: this holder carries on and writes,
			// with a context of its own, as a careless or paused one would.
			for commitID := range tryWrite {
				_, err := fence.Write(context.Background(), l.Committer(), sink, commitID,
					fencetest.Doc{ID: "example.com", Body: "from the partitioned holder"})
				wrote <- err
			}
			return context.Cause(ctx)
		})
	}()
	var l *executor.Lease
	select {
	case l = <-acquired:
	case err := <-runDone:
		t.Fatalf("holder: %v", err)
	}
	acquiredAt := time.Now()
	leaseID, token := l.LeaseID(), l.FencingToken()

	// Mid-work, right after a renewal succeeded over the proxy: cut the link.
	waitFor(t, 5*time.Second, "a first renewal", func() bool { return l.Renewals() >= 1 })
	renewalsAtCut, lastRenewal := l.Renewals(), l.Record()
	proxy.AddToxic("partition-up", "timeout", testenv.Upstream, map[string]any{"timeout": 0})
	proxy.AddToxic("partition-down", "timeout", testenv.Downstream, map[string]any{"timeout": 0})
	cutAt := time.Now()
	close(partitioned)
	t.Logf("acquired lease %s (token %d); renewed %d time(s); link cut %v after acquisition; holder's local expiry estimate %v after the cut",
		leaseID, token, renewalsAtCut, cutAt.Sub(acquiredAt).Round(time.Millisecond), l.LocalExpiry().Sub(cutAt).Round(time.Millisecond))

	// 1. The commit attempted while partitioned fails closed.
	var err error
	select {
	case err = <-partitionCommit:
	case <-time.After(10 * time.Second):
		t.Fatal("the commit attempted while partitioned did not return")
	}
	switch lease.CodeOf(err) {
	case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded:
		t.Logf("commit while partitioned failed closed after %v: %v", time.Since(cutAt).Round(time.Millisecond), err)
	default:
		t.Fatalf("commit while partitioned: %v, want a failure without authority", err)
	}

	// 2. The work is cancelled with a lease-loss cause...
	var c cancellation
	select {
	case c = <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the work was not cancelled after the partition")
	}
	if !executor.LeaseLoss(c.cause) || !errors.Is(c.cause, executor.ErrBackendUnavailable) {
		t.Fatalf("cancellation cause %v, want ErrBackendUnavailable", c.cause)
	}
	if n := l.Renewals(); n != renewalsAtCut {
		t.Fatalf("%d renewal(s) succeeded during the partition", n-renewalsAtCut)
	}
	t.Logf("work cancelled %v after the cut: %v", c.at.Sub(cutAt).Round(time.Millisecond), c.cause)

	// ... before the lease expires at the backend. Inspections over a direct
	// link, all sent after the cancellation: the backend says active (so not
	// expired at its own time when it answered) until it says expired.
	var (
		lastActiveSent, firstExpiredSeen time.Time
		backendExpiresAt                 time.Time
		polls                            int
	)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("the lease did not expire at the backend")
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		res, err := observer.Get(ctx, leaseID)
		cancel()
		if err != nil {
			t.Fatalf("direct inspection: %v", err)
		}
		polls++
		if res.Lease.FencingToken != token {
			t.Fatalf("direct inspection found token %d, want %d", res.Lease.FencingToken, token)
		}
		if res.Lease.State == lease.StateActive {
			lastActiveSent = sent
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if res.Lease.State != lease.StateExpired {
			t.Fatalf("lease state %s at the backend, want expired", res.Lease.State)
		}
		firstExpiredSeen, backendExpiresAt = time.Now(), res.Lease.ExpiresAt
		break
	}
	if lastActiveSent.IsZero() {
		t.Fatalf("the first inspection after the cancellation found the lease expired already: cancellation came too late")
	}
	if !lastActiveSent.After(c.at) {
		t.Fatal("inspection order broken") // cannot happen: every poll is sent after the cancellation
	}
	// The renewal never reached the server: its expires_at is the one the
	// holder last saw renewed.
	if !backendExpiresAt.Equal(lastRenewal.ExpiresAt.Time()) {
		t.Fatalf("backend expires_at %s, the holder's last renewal %s: a renewal went through the partition",
			backendExpiresAt, lastRenewal.ExpiresAt)
	}
	// Both processes share this host's clock, so the margin can also be read
	// off expires_at directly.
	if !c.at.Before(backendExpiresAt) {
		t.Fatalf("cancelled at %s, not before the backend's expires_at %s", c.at.UTC().Format(time.RFC3339Nano), backendExpiresAt)
	}
	t.Logf("backend still reported the lease active %d poll(s) and at least %v after the cancellation; it reported it expired %v after the cancellation; expires_at − cancellation = %v (same host clock)",
		polls-1, lastActiveSent.Sub(c.at).Round(time.Millisecond), firstExpiredSeen.Sub(c.at).Round(time.Millisecond),
		backendExpiresAt.Sub(c.at).Round(time.Millisecond))

	// 3. Heal the partition. The holder writes: its lease expired at the
	// backend, so its commit is refused there and never reaches the store.
	proxy.Clear()
	holderWrite := func(commitID string) error {
		select {
		case tryWrite <- commitID:
		case err := <-runDone:
			t.Fatalf("the holder returned early: %v", err)
		}
		select {
		case err := <-wrote:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("the holder's write did not return")
			return nil
		}
	}
	if err := holderWrite("holder-after-expiry"); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("holder's commit after expiry, link restored: %v, want lease_lost", err)
	} else {
		t.Logf("holder's commit after the link healed: %v", err)
	}

	// A successor acquires over a direct link and commits; the old holder's
	// next commit (lower token) is refused too.
	var successorToken uint64
	err = executor.Run(t.Context(), successorStore, specFor("successor"), func(ctx context.Context, sl *executor.Lease) error {
		successorToken = sl.FencingToken()
		if successorToken <= token {
			return fmt.Errorf("successor token %d not above %d", successorToken, token)
		}
		if _, err := fence.Write(ctx, sl.Committer(), sink, "successor-result",
			fencetest.Doc{ID: "example.com", Body: "from the successor"}); err != nil {
			return fmt.Errorf("successor's commit: %w", err)
		}
		if err := holderWrite("holder-after-successor"); lease.CodeOf(err) != lease.CodeLost {
			return fmt.Errorf("old holder's commit while the successor holds: %v, want lease_lost", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	close(tryWrite)
	select {
	case err = <-runDone:
	case <-time.After(15 * time.Second):
		t.Fatal("the holder's Run did not return")
	}
	if !errors.Is(err, executor.ErrBackendUnavailable) {
		t.Fatalf("holder's Run: %v", err)
	}

	// The fenced store holds only the successor's write.
	accepted := sink.Accepted()
	if len(accepted) != 1 || accepted[0].Guard.FencingToken != successorToken || accepted[0].Body != "from the successor" ||
		len(sink.Rejected()) != 0 {
		t.Fatalf("store: accepted %+v, rejected %+v", accepted, sink.Rejected())
	}
	if doc, _ := sink.Get("example.com"); doc.Body != "from the successor" || doc.Guard.LeaseID == leaseID {
		t.Fatalf("stored document %+v", doc)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	res, err := observer.Get(ctx, leaseID)
	if err != nil || res.Lease.State != lease.StateExpired {
		t.Fatalf("holder's lease at the end: %v %+v", err, res)
	}
	t.Logf("successor committed under token %d; the holder's two late commits were lease_lost; the store holds only the successor's write", successorToken)
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
