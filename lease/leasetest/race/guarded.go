package race

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"strconv"
	"sync"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

// This file carries the traffic's authorizations through to guarded sink
// writes, the second half of fencing: after each accepted authorization a
// worker writes the one document it was authorized for into an in-memory
// fenced sink (fencetest.MemorySink, the reference of every sink's rule),
// now or later (after its lease may have ended), and sometimes tries to
// misuse the guard for another document or another body. Check then
// verifies, per identity and sink, that every write the sinks accepted was
// authorized for exactly that write: its commit id was authorized (while
// the lease was live: the linearizability check covers the authorization),
// for that document, that body, that lease and that token.

// docsPerIdentity is how many documents of each identity the traffic writes.
const docsPerIdentity = 3

type authorization struct {
	ident  int
	commit lease.Commit
	doc    fencetest.Doc
}

type pendingWrite struct {
	sink  string
	guard fence.Guard
	doc   fencetest.Doc
}

// guardedWrites are the sinks and what was authorized for them.
type guardedWrites struct {
	lockKeys []string

	mu       sync.Mutex
	sinks    map[string]*fencetest.MemorySink
	auths    map[string]authorization // by sink and commit id
	deferred []pendingWrite
	// problems are sink answers the contract does not allow.
	problems []string
	// counts of what happened, for the summary and coverage.
	landed, refused, misusesRefused int
}

func newGuardedWrites(ids []lease.Identity) *guardedWrites {
	g := &guardedWrites{sinks: map[string]*fencetest.MemorySink{}, auths: map[string]authorization{}}
	for _, id := range ids {
		_, key, err := lease.CanonicalLockKey(id, lease.DefaultOperationClasses())
		if err != nil {
			panic(err)
		}
		g.lockKeys = append(g.lockKeys, key)
	}
	for _, s := range Sinks {
		g.sinks[s] = fencetest.NewMemorySink(s)
	}
	return g
}

// doc picks one of identity ident's documents with a fresh body.
func (g *guardedWrites) doc(rng *mrand.Rand, ident int) fencetest.Doc {
	return fencetest.Doc{ID: docID(ident, rng.IntN(docsPerIdentity)), Body: uid("body_")}
}

func docID(ident, n int) string { return "identity-" + strconv.Itoa(ident) + "/doc-" + strconv.Itoa(n) }

func bodyDigest(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}

// authorized records an accepted authorization of doc and acts on it: the
// authorized write now (mostly) or later, or a misuse of its guard, which
// the sink must refuse. A deferred write of an earlier authorization is
// made first, so late writes race with successors.
func (g *guardedWrites) authorized(ctx context.Context, rng *mrand.Rand, ident int, c lease.Commit, doc fencetest.Doc) {
	guard := fence.NewGuard(fence.Envelope{LockKey: g.lockKeys[ident]}, c)
	g.mu.Lock()
	g.auths[c.Sink+"\x00"+c.CommitID] = authorization{ident: ident, commit: c, doc: doc}
	var late *pendingWrite
	if n := len(g.deferred); n > 0 && rng.IntN(2) == 0 {
		i := rng.IntN(n)
		p := g.deferred[i]
		late = &p
		g.deferred = append(g.deferred[:i], g.deferred[i+1:]...)
	}
	g.mu.Unlock()
	if late != nil {
		g.write(ctx, late.sink, late.guard, late.doc, false)
	}
	switch r := rng.IntN(100); {
	case r < 70:
		g.write(ctx, c.Sink, guard, doc, false)
	case r < 80:
		g.mu.Lock()
		g.deferred = append(g.deferred, pendingWrite{sink: c.Sink, guard: guard, doc: doc})
		g.mu.Unlock()
	case r < 90:
		other := docID(ident, (rng.IntN(docsPerIdentity-1)+1+docIndex(doc.ID))%docsPerIdentity)
		g.write(ctx, c.Sink, guard, fencetest.Doc{ID: other, Body: doc.Body}, true)
	default:
		g.write(ctx, c.Sink, guard, fencetest.Doc{ID: doc.ID, Body: uid("body_")}, true)
	}
}

func docIndex(id string) int {
	n, _ := strconv.Atoi(id[len(id)-1:])
	return n
}

// write makes one guarded write. An authorized write may land or be refused
// (a higher token already wrote the document); a misuse must be refused.
func (g *guardedWrites) write(ctx context.Context, sink string, guard fence.Guard, doc fencetest.Doc, misuse bool) {
	err := g.sinks[sink].Commit(ctx, guard, doc)
	g.mu.Lock()
	defer g.mu.Unlock()
	code := lease.CodeOf(err)
	switch {
	case err != nil && code != lease.CodeCommitRejected && code != lease.CodeConflict:
		g.problems = append(g.problems, fmt.Sprintf("sink %s answered a guarded write of %s with %v, not commit_rejected or a conflict", sink, doc.ID, err))
	case misuse && err == nil:
		g.problems = append(g.problems, fmt.Sprintf("sink %s accepted the guard of commit %s for a write it was not issued for (%s)", sink, guard.CommitID, doc.ID))
	case misuse:
		g.misusesRefused++
	case err == nil:
		g.landed++
	default:
		g.refused++
	}
}

// check verifies every accepted write against its authorization.
func (g *guardedWrites) check() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	problems := append([]string(nil), g.problems...)
	names := make([]string, 0, len(g.sinks))
	for name := range g.sinks {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		// Per document, accepted writes only move forward: a higher token,
		// or the same lease's later commit. Nothing rolls a document back.
		last := map[string]fence.Guard{}
		for _, w := range g.sinks[name].Accepted() {
			if p, ok := last[w.ID]; ok && (w.Guard.FencingToken < p.FencingToken ||
				(w.Guard.FencingToken == p.FencingToken && w.Guard.CommitSeq <= p.CommitSeq)) {
				problems = append(problems, fmt.Sprintf("sink %s: %s went back from token %d commit %d to token %d commit %d",
					name, w.ID, p.FencingToken, p.CommitSeq, w.Guard.FencingToken, w.Guard.CommitSeq))
			}
			last[w.ID] = w.Guard
			a, ok := g.auths[name+"\x00"+w.Guard.CommitID]
			c := a.commit
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("sink %s holds a write of %s under commit %s, which was never authorized", name, w.ID, w.Guard.CommitID))
			case c.Target != w.ID || c.PayloadSHA256 != bodyDigest(w.Body) || a.doc.ID != w.ID || a.doc.Body != w.Body:
				problems = append(problems, fmt.Sprintf("sink %s holds %s under commit %s, which was authorized for %s", name, w.ID, w.Guard.CommitID, c.Target))
			case c.LeaseID != w.Guard.LeaseID || c.FencingToken != w.Guard.FencingToken || w.Guard.LockKey != g.lockKeys[a.ident]:
				problems = append(problems, fmt.Sprintf("sink %s holds %s under a guard that is not its authorization's lease", name, w.ID))
			case w.ID[:len("identity-"+strconv.Itoa(a.ident)+"/")] != "identity-"+strconv.Itoa(a.ident)+"/":
				problems = append(problems, fmt.Sprintf("sink %s holds %s, a document of another identity than commit %s's", name, w.ID, c.CommitID))
			}
		}
	}
	return problems
}

func (g *guardedWrites) counts() (landed, refused, misusesRefused int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.landed, g.refused, g.misusesRefused
}
