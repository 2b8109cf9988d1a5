package race

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

// The race suite's guarded sink writes (issue 11 §7) are checked per
// identity and sink: every write a sink accepted must have been authorized,
// for exactly that document and body, under that lease and token, of that
// identity. A check that cannot fail proves nothing: each case below
// plants one write the contract forbids straight into a sink (as a broken
// sink or traffic would) and requires check to name it; a clean history
// must pass.
func TestGuardedWritesCheckCatchesWhatItMust(t *testing.T) {
	ids := []lease.Identity{
		{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns", TargetID: "t-0", ActorName: "actor"},
		{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns", TargetID: "t-1", ActorName: "actor"},
	}
	at := lease.At(time.Now())
	commit := func(id, leaseID string, token uint64, doc fencetest.Doc) lease.Commit {
		return lease.Commit{LeaseID: leaseID, FencingToken: token, ExecutionID: "exec", JobID: "job", Sink: "couchdb",
			CommitID: id, Target: doc.ID, PayloadSHA256: bodyDigest(doc.Body), Seq: 1, AcceptedAt: at}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// plant records authorizations in g and makes writes to its sinks.
		plant func(g *guardedWrites)
		want  string // a substring of the problem; "" for none
	}{
		{"clean", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			c := commit("c1", "lease-1", 1, doc)
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: c, doc: doc}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, c), doc, false)
		}, ""},
		{"never_authorized", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, commit("c9", "lease-1", 1, doc)), doc, false)
		}, "which was never authorized"},
		{"authorized_for_another_document", func(g *guardedWrites) {
			a := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			b := fencetest.Doc{ID: docID(0, 1), Body: "b1"}
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: commit("c1", "lease-1", 1, a), doc: a}
			// A guard carrying c1's commit id, bound to document b.
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, commit("c1", "lease-1", 1, b)), b, false)
		}, "which was authorized for"},
		{"authorized_for_another_body", func(g *guardedWrites) {
			a := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			b := fencetest.Doc{ID: docID(0, 0), Body: "b2"}
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: commit("c1", "lease-1", 1, a), doc: a}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, commit("c1", "lease-1", 1, b)), b, false)
		}, "which was authorized for"},
		{"another_lease", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: commit("c1", "lease-1", 1, doc), doc: doc}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, commit("c1", "lease-2", 2, doc)), doc, false)
		}, "not its authorization's lease"},
		{"another_identity's_lock_key", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			c := commit("c1", "lease-1", 1, doc)
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: c, doc: doc}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[1]}, c), doc, false)
		}, "not its authorization's lease"},
		{"another_identity's_document", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(1, 0), Body: "b1"}
			c := commit("c1", "lease-1", 1, doc)
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: c, doc: doc}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, c), doc, false)
		}, "a document of another identity"},
		{"misuse_accepted", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			c := commit("c1", "lease-1", 1, doc)
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: c, doc: doc}
			// Reported as a misuse but the sink accepts it: the check must say so.
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, c), doc, true)
		}, "for a write it was not issued for"},
		{"misuse_refused", func(g *guardedWrites) {
			doc := fencetest.Doc{ID: docID(0, 0), Body: "b1"}
			c := commit("c1", "lease-1", 1, doc)
			g.auths["couchdb\x00c1"] = authorization{ident: 0, commit: c, doc: doc}
			g.write(ctx, "couchdb", fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[0]}, c), fencetest.Doc{ID: docID(0, 2), Body: "b1"}, true)
			if _, _, refused := g.counts(); refused != 1 {
				t.Errorf("misuse_refused: %d misuses counted refused, want 1", refused)
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuardedWrites(ids)
			tc.plant(g)
			problems := g.check()
			switch {
			case tc.want == "" && len(problems) > 0:
				t.Fatalf("a clean history reported %q", problems)
			case tc.want != "" && (len(problems) == 0 || !strings.Contains(strings.Join(problems, "\n"), tc.want)):
				t.Fatalf("check reported %q, want a problem containing %q", problems, tc.want)
			}
		})
	}
}
