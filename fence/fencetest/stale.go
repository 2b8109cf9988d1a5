package fencetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// StaleHolder is the stale-holder property of one fenced sink, run against
// a real lease backend and the real store behind the sink: a holder writes,
// gets one more write authorized, and then loses its lease (revoked,
// force-released, released, expired, superseded). It then tries every write
// path it still has: a new commit id, its commit id replayed for another
// body or another object, its old guards on another body, another object or
// another job's document. None may land. The write authorized before the
// lease ended may still land (the contract lets a commit linearized while
// the lease was valid finish), unless a successor wrote the object with a
// higher token. What the sink holds at the end is read back and compared.
type StaleHolder[P any] struct {
	// Store is the lease backend; Now its clock (for deadlines).
	Store lease.Store
	Now   func() time.Time
	// Expire makes every lease acquired so far expire at backend time
	// (advance a settable clock, or wait past the TTL).
	Expire func()
	TTL    time.Duration
	// Identity is the base identity; each ending runs on its own target.
	Identity                 lease.Identity
	Holder, Successor, Admin lease.Caller
	Sink                     fence.Sink[P]
	// Objects is how many distinct objects Payload can name for one
	// lease: 1 for sinks with one document per identity or job, else 2.
	Objects int
	// Payload is the write labelled label to object obj (0 or 1) under
	// the lease rec.
	Payload func(rec *lease.Record, obj int, label string) P
	// Read returns the label object obj of rec's identity holds and the
	// guard of its last write.
	Read func(ctx context.Context, rec *lease.Record, obj int) (string, *fence.Guard, error)
	// JobBound reports that the sink's objects belong to the lease's job:
	// a guard must not write another job's object.
	JobBound bool
}

// Run runs every ending as a subtest. A holder also writes the same
// object twice, and replaying its first commit (commit id or guard) must
// never roll the object back to it.
func (s StaleHolder[P]) Run(t *testing.T) {
	for _, end := range []string{"revoke", "force_release", "release", "expiry", "supersession"} {
		t.Run(end, func(t *testing.T) { s.run(t, end) })
	}
}

func (s StaleHolder[P]) mutation(c lease.Caller, requestID string) lease.Mutation {
	return lease.Mutation{RequestID: requestID, DeadlineAt: s.Now().Add(time.Hour), Caller: c}
}

// acquire acquires id for c. A job-bound sink's successor takes over the
// same job (a retried job), so it writes the same job document.
func (s StaleHolder[P]) acquire(t *testing.T, id lease.Identity, c lease.Caller, name, job string) *lease.Record {
	t.Helper()
	if job == "" {
		job = "job-" + name + "-" + id.TargetID
	}
	res, err := s.Store.Acquire(context.Background(), lease.AcquireRequest{Identity: id,
		ServiceInstanceID: "instance-" + name, TTL: s.TTL, MaximumLifetime: time.Hour,
		ExecutionID: "execution-" + name + "-" + id.TargetID, JobID: job,
		Mutation: s.mutation(c, "acquire-"+name+"-"+id.TargetID)})
	if err != nil {
		t.Fatalf("%s acquires: %v", name, err)
	}
	return res.Lease
}

func (s StaleHolder[P]) committer(rec *lease.Record, c lease.Caller) *fence.Committer {
	return fence.NewCommitter(s.Store, fence.EnvelopeOf(rec), c, fence.WithClock(s.Now), fence.WithAttempts(1))
}

func (s StaleHolder[P]) run(t *testing.T, end string) {
	ctx := context.Background()
	id := s.Identity
	id.TargetID += "-" + end
	other := min(1, s.Objects-1)

	a := s.acquire(t, id, s.Holder, "holder", "")
	ca := s.committer(a, s.Holder)
	g1, err := fence.Write(ctx, ca, s.Sink, "a-1", s.Payload(a, 0, "a-1"))
	if err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	// A later write of the same object: replaying a-1 must never roll it
	// back.
	if _, err := fence.Write(ctx, ca, s.Sink, "a-2", s.Payload(a, 0, "a-2")); err != nil {
		t.Fatalf("the holder's second write: %v", err)
	}
	// One more write is authorized while the lease is live, and made only
	// after it ended (a holder paused between the two steps).
	pending, err := s.Sink.Bind(s.Payload(a, other, "a-pending"))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := ca.Authorize(ctx, s.Sink.Name(), "a-pending", pending)
	if err != nil {
		t.Fatalf("authorizing the pending write: %v", err)
	}
	gPending := ca.Guard(pc)

	superseded := end == "supersession"
	switch end {
	case "revoke", "force_release":
		req := lease.AdminRequest{Identity: id, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
			Reason: "stale-holder property", Mutation: s.mutation(s.Admin, "admin-"+id.TargetID)}
		if end == "revoke" {
			_, err = s.Store.Revoke(ctx, req)
		} else {
			_, err = s.Store.ForceRelease(ctx, req)
		}
	case "release":
		_, err = s.Store.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
			ServiceInstanceID: a.ServiceInstanceID, Mutation: s.mutation(s.Holder, "release-"+id.TargetID)})
	case "expiry", "supersession":
		s.Expire()
	}
	if err != nil {
		t.Fatalf("%s: %v", end, err)
	}
	if superseded {
		job := ""
		if s.JobBound {
			job = a.JobID
		}
		b := s.acquire(t, id, s.Successor, "successor", job)
		cb := s.committer(b, s.Successor)
		for obj := range s.Objects {
			if _, err := fence.Write(ctx, cb, s.Sink, "b-"+string(rune('0'+obj)), s.Payload(b, obj, "b-"+string(rune('0'+obj)))); err != nil {
				t.Fatalf("the successor's write: %v", err)
			}
		}
	}

	otherJob := *a
	otherJob.JobID = "job-of-someone-else"
	type attempt struct {
		name string
		err  error
		want []lease.Code
	}
	lost := []lease.Code{lease.CodeLost}
	conflict := []lease.Code{lease.CodeIdempotencyConflict}
	rejected := []lease.Code{lease.CodeCommitRejected}
	write := func(commitID string, p P) error { _, err := fence.Write(ctx, ca, s.Sink, commitID, p); return err }
	rollback := []lease.Code{lease.CodeConflict, lease.CodeCommitRejected}
	attempts := []attempt{
		{"replayed earlier commit over the later one", write("a-1", s.Payload(a, 0, "a-1")), rollback},
		{"old guard over the later write", s.Sink.Commit(ctx, g1, s.Payload(a, 0, "a-1")), rollback},
		{"new commit id", write("a-new", s.Payload(a, 0, "a-new")), lost},
		{"replayed commit id, another body", write("a-1", s.Payload(a, 0, "a-1-changed")), conflict},
		{"old guard, another body", s.Sink.Commit(ctx, g1, s.Payload(a, 0, "a-1-changed")), rejected},
		{"pending guard, another body", s.Sink.Commit(ctx, gPending, s.Payload(a, other, "a-pending-changed")), rejected},
	}
	if s.Objects > 1 {
		attempts = append(attempts,
			attempt{"replayed commit id, another object", write("a-1", s.Payload(a, 1, "a-1")), conflict},
			attempt{"old guard, another object", s.Sink.Commit(ctx, g1, s.Payload(a, 1, "a-1")), rejected})
	}
	if s.JobBound {
		// Refused by the binding whatever the lease's state: the guard
		// names another document, and another job.
		attempts = append(attempts,
			attempt{"old guard, another job's document", s.Sink.Commit(ctx, g1, s.Payload(&otherJob, 0, "a-1")), rejected})
	}
	for _, at := range attempts {
		if c := lease.CodeOf(at.err); !slices.Contains(at.want, c) {
			t.Errorf("%s: %v, want one of %v", at.name, at.err, at.want)
		}
	}

	// The write authorized while the lease was live may still land, for
	// exactly its object and body; a successor's higher token refuses it.
	err = s.Sink.Commit(ctx, gPending, s.Payload(a, other, "a-pending"))
	switch {
	case superseded && lease.CodeOf(err) != lease.CodeCommitRejected:
		t.Errorf("pending write after a successor wrote: %v, want commit_rejected", err)
	case !superseded && err != nil:
		t.Errorf("pending write authorized while the lease was live: %v, want it to land", err)
	}

	want := map[int]string{0: "a-2", other: "a-pending"}
	if superseded {
		want = map[int]string{0: "b-0", other: "b-" + string(rune('0'+other))}
	}
	for obj, label := range want {
		got, g, err := s.Read(ctx, a, obj)
		if err != nil || got != label || g == nil {
			t.Errorf("object %d holds %q (guard %+v, %v), want %q", obj, got, g, err, label)
			continue
		}
		if !superseded && (g.LeaseID != a.LeaseID || g.Target == "" || g.JobID != a.JobID) {
			t.Errorf("object %d holds a guard %+v that is not the holder's bound guard", obj, g)
		}
	}
}
