package clients_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// nimPublication is what the Nim suite reports of a publication it made
// (published) or that the server refused (refused): enough to derive its
// message id and to check its fence headers and body on the broker.
type nimPublication struct {
	MessageID         string            `json:"message_id"`
	CommitID          string            `json:"commit_id"`
	Sink              string            `json:"sink"`
	BodyB64           string            `json:"body_b64"`
	ContentType       string            `json:"content_type"`
	PayloadSHA256     string            `json:"payload_sha256"`
	LeaseID           string            `json:"lease_id"`
	FencingToken      uint64            `json:"fencing_token"`
	ExecutionID       string            `json:"execution_id"`
	JobID             string            `json:"job_id"`
	TraceID           string            `json:"trace_id"`
	ServiceInstanceID string            `json:"service_instance_id"`
	LockIdentity      lease.Identity    `json:"lock_identity"`
	Headers           map[string]string `json:"headers"`

	body    []byte
	lockKey string
}

// nimCouchDoc is what the Nim suite reports of a document it wrote: the
// revision and guard it must hold and the exact body bytes it sent.
type nimCouchDoc struct {
	DB           string          `json:"db"`
	DocID        string          `json:"doc_id"`
	Rev          string          `json:"rev"`
	BodyText     string          `json:"body_text"`
	Guard        json.RawMessage `json:"guard"`
	LeaseID      string          `json:"lease_id"`
	FencingToken uint64          `json:"fencing_token"`
}

// nimCouchStale is a document a stale holder (its lease revoked, a newer
// lease's write stored) was refused on.
type nimCouchStale struct {
	DocID        string          `json:"doc_id"`
	LeaseID      string          `json:"lease_id"`
	FencingToken uint64          `json:"fencing_token"`
	Guard        json.RawMessage `json:"guard"`
}

// nimDigestBodies are random bodies of every length across the SHA-256
// block boundaries and a few large ones, with Go's digests, for the Nim
// SHA-256 to match.
func nimDigestBodies(t *testing.T) string {
	t.Helper()
	var out []map[string]string
	lengths := []int{1000, 4095, 4096, 65537, 1<<20 + 3}
	for n := 0; n <= 130; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		out = append(out, map[string]string{"b64": base64.StdEncoding.EncodeToString(b), "sha256": lease.PayloadSHA256(b)})
	}
	raw, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "digests.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// nimUnfencedDBs creates a database without the fence and one whose fence
// design document holds another function, and returns their names.
func nimUnfencedDBs(t *testing.T, s *stack) (plain, otherFence string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plain, otherFence = "nim_plain", "nim_other_fence"
	for _, name := range []string{plain, otherFence} {
		db, err := couchdb.New(s.couch.URL(), name)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.EnsureDatabase(ctx); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	design, _ := json.Marshal(map[string]string{"language": "javascript",
		"validate_doc_update": "function (newDoc, oldDoc, userCtx, secObj) {}"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut,
		s.couch.URL()+"/"+otherFence+"/_design/starintel_fence", bytes.NewReader(design))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("install another fence in %s: HTTP %d", otherFence, resp.StatusCode)
	}
	return plain, otherFence
}

// checkNimCouch reads the documents the Nim suite wrote back with the Go
// couchdb package: each holds the revision, body and fence the suite
// reported, the fence is a valid guard bound to exactly the bytes the suite
// sent (by Go's SHA-256), and a stale holder's guard lost to the newer one.
func checkNimCouch(t *testing.T, s *stack, docs []*nimCouchDoc, stale []*nimCouchStale) {
	t.Helper()
	if len(docs) < 5 || len(stale) < 1 {
		t.Fatalf("the suite reported %d CouchDB documents and %d stale refusals; want at least 5 and 1", len(docs), len(stale))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	byID := map[string]couchdb.Stored{}
	for _, d := range docs {
		db, err := couchdb.New(s.couch.URL(), d.DB)
		if err != nil {
			t.Fatal(err)
		}
		got, err := db.Get(ctx, d.DocID)
		if err != nil {
			t.Errorf("%s/%s: %v", d.DB, d.DocID, err)
			continue
		}
		byID[d.DocID] = got
		var want fence.Guard
		if err := json.Unmarshal(d.Guard, &want); err != nil {
			t.Errorf("%s: the reported guard does not decode: %v", d.DocID, err)
			continue
		}
		if got.Fence == nil {
			t.Errorf("%s: stored without a fence", d.DocID)
			continue
		}
		gotJSON, _ := json.Marshal(*got.Fence)
		wantJSON, _ := json.Marshal(want)
		if !bytes.Equal(gotJSON, wantJSON) {
			t.Errorf("%s: stored fence %s, the Nim suite reported %s", d.DocID, gotJSON, wantJSON)
		}
		if err := fence.Admit(nil, *got.Fence); err != nil {
			t.Errorf("%s: stored fence %s is not admissible: %v", d.DocID, gotJSON, err)
		}
		if err := got.Fence.Authorizes(fence.Binding{Target: d.DocID,
			PayloadSHA256: lease.PayloadSHA256([]byte(d.BodyText))}); err != nil {
			t.Errorf("%s: the fence is not bound to the body sent (%s): %v", d.DocID, d.BodyText, err)
		}
		if got.Fence.LeaseID != d.LeaseID || got.Fence.FencingToken != d.FencingToken || got.Fence.Sink != "couchdb" {
			t.Errorf("%s: fence lease %s token %d sink %s, want lease %s token %d sink couchdb", d.DocID,
				got.Fence.LeaseID, got.Fence.FencingToken, got.Fence.Sink, d.LeaseID, d.FencingToken)
		}
		if got.Rev != d.Rev {
			t.Errorf("%s: revision %s, the Nim suite reported %s", d.DocID, got.Rev, d.Rev)
		}
		var x, y any
		if json.Unmarshal(got.Body, &x) != nil || json.Unmarshal([]byte(d.BodyText), &y) != nil || !reflect.DeepEqual(x, y) {
			t.Errorf("%s: body %s, the Nim suite sent %s", d.DocID, got.Body, d.BodyText)
		}
	}
	for _, st := range stale {
		got, ok := byID[st.DocID]
		if !ok || got.Fence == nil {
			t.Errorf("stale %s: the newer write was not reported", st.DocID)
			continue
		}
		if got.Fence.LeaseID == st.LeaseID || got.Fence.FencingToken <= st.FencingToken {
			t.Errorf("stale %s: stored fence lease %s token %d; the stale holder had lease %s token %d",
				st.DocID, got.Fence.LeaseID, got.Fence.FencingToken, st.LeaseID, st.FencingToken)
		}
		var old fence.Guard
		if err := json.Unmarshal(st.Guard, &old); err != nil {
			t.Errorf("stale %s: guard: %v", st.DocID, err)
			continue
		}
		// Go's rule agrees with the fence that refused the Nim replay.
		if err := fence.Admit(got.Fence, old); lease.CodeOf(err) != lease.CodeCommitRejected {
			t.Errorf("stale %s: fence.Admit(stored, the stale guard) = %v, want commit_rejected", st.DocID, err)
		}
	}
	t.Logf("in CouchDB: %d documents of the Nim suite read back with their fence; %d stale holders refused",
		len(docs), len(stale))
}

// TestNimClientFenceDigest checks that the Nim client's record of the
// fence it requires is the fence the Go package installs: the two never
// drift.
func TestNimClientFenceDigest(t *testing.T) {
	src, err := os.ReadFile("nim/starlease.nim")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+FenceSha256\* = "([0-9a-f]{64})"$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("nim/starlease.nim has no FenceSha256")
	}
	sum := sha256.Sum256([]byte(couchdb.ValidateDocUpdate))
	if want := hex.EncodeToString(sum[:]); string(m[1]) != want {
		t.Fatalf("FenceSha256 is %s; the Go fence's SHA-256 is %s: update the Nim client with the fence", m[1], want)
	}
}

// TestNimClient runs the Nim client's suite (clients/nim/tests) against
// "starlease serve" with its outbox relay, a real broker and a
// CouchDB-protocol server, then checks on the broker what the suite
// reported: every publication it made was delivered with its exact body,
// content type and fence headers (the suite's lease id, fencing token, lock
// key, execution, commit and trace ids), under the message id the Go
// publisher derives for the same commit; and no publication the server
// refused (after release, after revoke) was delivered, under its message id
// or with its body. In CouchDB, every document the suite wrote holds the
// fence and body it reported (read with the Go couchdb package).
func TestNimClient(t *testing.T) {
	nimc := nim(t) // fails, never skips, without the compiler
	s := startStack(t)
	const queue = "nim-client"
	s.broker.DeclareQueues(t, queue)
	urlFile := filepath.Join(t.TempDir(), "rabbitmq-url")
	if err := os.WriteFile(urlFile, []byte(s.broker.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testenv.StartStarlease(t, s.bin, "--rabbitmq-url-file", urlFile, "--relay-poll-interval", "50ms")
	const principal = "prn-nim-actor"
	const scope = "tenant:tenant-a,program:program-a"
	actorKey, _ := srv.CreateKey(principal, "api_client", "targets:lease", scope)
	adminKey, _ := srv.CreateKey("prn-nim-admin", "administrator", "targets:lease,targets:force-release", scope)

	// The bodies the suite publishes, with their SHA-256 (the Nim standard
	// library has none): text with non-ASCII characters, and every byte
	// value (base64 with padding).
	text := []byte(fmt.Sprintf("fediwatch result %s – naïve ✓", rand.Text()))
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	var bodies []map[string]string
	for _, b := range []struct {
		body        []byte
		contentType string
	}{{text, "text/plain; charset=utf-8"}, {binary, "application/octet-stream"}} {
		sum := sha256.Sum256(b.body)
		bodies = append(bodies, map[string]string{"b64": base64.StdEncoding.EncodeToString(b.body),
			"sha256": hex.EncodeToString(sum[:]), "content_type": b.contentType})
	}
	bodiesJSON, err := json.Marshal(bodies)
	if err != nil {
		t.Fatal(err)
	}

	fenced := s.fencedDB(t, "nim_fenced")
	plain, otherFence := nimUnfencedDBs(t, s)

	results := filepath.Join(t.TempDir(), "results.json")
	cache := t.TempDir()
	runSuite(t, "nim", s.env(
		"STARLEASE_NIM_URL="+srv.URL(),
		"STARLEASE_NIM_ACTOR_KEY="+actorKey,
		"STARLEASE_NIM_ADMIN_KEY="+adminKey,
		"STARLEASE_NIM_QUEUE="+queue,
		"STARLEASE_NIM_BODIES="+string(bodiesJSON),
		"STARLEASE_NIM_DIGESTS="+nimDigestBodies(t),
		"STARLEASE_NIM_COUCHDB="+s.couch.URL()+"/"+fenced.Name(),
		"STARLEASE_NIM_COUCHDB_PLAIN="+s.couch.URL()+"/"+plain,
		"STARLEASE_NIM_COUCHDB_OTHER_FENCE="+s.couch.URL()+"/"+otherFence,
		"STARLEASE_NIM_RESULTS="+results,
	), 5*time.Minute, nimc, "c", "-r", "--hints:off", "--nimcache:"+cache,
		"-o:"+filepath.Join(cache, "test_starlease"), "tests/test_starlease.nim")

	raw, err := os.ReadFile(results)
	if err != nil {
		t.Fatalf("the Nim suite wrote no results: %v", err)
	}
	var report struct {
		Published  []*nimPublication `json:"published"`
		Refused    []*nimPublication `json:"refused"`
		Couch      []*nimCouchDoc    `json:"couch"`
		CouchStale []*nimCouchStale  `json:"couch_stale"`
	}
	if err := json.Unmarshal(raw, &report); err != nil {
		t.Fatalf("results do not decode: %v", err)
	}
	checkNimCouch(t, s, report.Couch, report.CouchStale)
	// Two bodies on one lease, one whose answered digest a proxy changed,
	// one through the answer-dropping proxy; refused after release and
	// after revoke.
	if len(report.Published) < 4 || len(report.Refused) < 2 {
		t.Fatalf("the suite reported %d publications and %d refusals; want at least 4 and 2",
			len(report.Published), len(report.Refused))
	}
	revoked := false
	for _, r := range report.Refused {
		revoked = revoked || strings.HasPrefix(r.CommitID, "c-after-revoke-")
	}
	if !revoked {
		t.Fatal("the suite reported no publication refused after revoke")
	}

	// Every reported publication: its body, its digest as the server
	// answered it, and its message id as the Go publisher derives it.
	want := map[string]*nimPublication{}
	var accepted, refusedIDs []string
	var staleBodies [][]byte
	withHeaders := 0
	for _, set := range []struct {
		name string
		pubs []*nimPublication
	}{{"published", report.Published}, {"refused", report.Refused}} {
		for _, p := range set.pubs {
			if p.body, err = base64.StdEncoding.DecodeString(p.BodyB64); err != nil {
				t.Fatalf("%s %s: body: %v", set.name, p.CommitID, err)
			}
			_, key, err := lease.CanonicalLockKey(p.LockIdentity, lease.DefaultOperationClasses())
			if err != nil {
				t.Fatalf("%s %s: lock identity %+v: %v", set.name, p.CommitID, p.LockIdentity, err)
			}
			p.lockKey = key
			id, err := rabbitmq.MessageID(fence.Envelope{LockKey: key, Identity: p.LockIdentity, LeaseID: p.LeaseID,
				FencingToken: p.FencingToken, ExecutionID: p.ExecutionID, JobID: p.JobID, TraceID: p.TraceID,
				ServiceInstanceID: p.ServiceInstanceID, OwnerPrincipalID: principal}, p.Sink, p.CommitID)
			if err != nil {
				t.Fatalf("%s %s: message id: %v", set.name, p.CommitID, err)
			}
			if set.name == "refused" {
				refusedIDs = append(refusedIDs, id)
				staleBodies = append(staleBodies, p.body)
				continue
			}
			if p.MessageID != id {
				t.Errorf("published %s: the server answered message id %s, the Go publisher derives %s", p.CommitID, p.MessageID, id)
			}
			if got := lease.PayloadSHA256(p.body); p.PayloadSHA256 != got {
				t.Errorf("published %s: payload_sha256 %s, the body's SHA-256 is %s", p.CommitID, p.PayloadSHA256, got)
			}
			if p.FencingToken < 1 || !strings.HasPrefix(p.MessageID, "msg_") {
				t.Errorf("published %s: token %d, message id %q", p.CommitID, p.FencingToken, p.MessageID)
			}
			if want[p.MessageID] == nil {
				accepted = append(accepted, p.MessageID)
				if len(p.Headers) > 0 {
					withHeaders++
				}
			}
			want[p.MessageID] = p
		}
	}
	if withHeaders == 0 {
		t.Error("no publication of the suite carried application headers")
	}
	if t.Failed() {
		t.FailNow()
	}

	// On the broker: each accepted message id delivered, persistent, with
	// exactly its body and fence; nothing refused, and no refused body.
	got := testenv.NewDeliveries(func(m amqp.Delivery) bool {
		for _, stale := range staleBodies {
			if bytes.Equal(m.Body, stale) {
				t.Errorf("delivery %s carries the body of a refused publication", m.MessageId)
				return false
			}
		}
		p := want[m.MessageId]
		if p == nil {
			return false // Check reports it as never accepted
		}
		f, err := rabbitmq.FenceOf(m)
		if err != nil {
			t.Errorf("delivery %s: %v", m.MessageId, err)
			return false
		}
		wantFence := rabbitmq.Fence{MessageID: p.MessageID, LockKey: p.lockKey, LeaseID: p.LeaseID,
			FencingToken: p.FencingToken, ExecutionID: p.ExecutionID, TraceID: p.TraceID, Sink: p.Sink,
			CommitID: p.CommitID, AcceptedAt: f.AcceptedAt}
		ok := true
		if f != wantFence || f.AcceptedAt.IsZero() {
			t.Errorf("delivery %s: fence %+v, want %+v", m.MessageId, f, wantFence)
			ok = false
		}
		if tok, isInt := m.Headers[rabbitmq.HeaderFencingToken].(int64); !isInt || tok != int64(p.FencingToken) {
			t.Errorf("delivery %s: %s = %#v, want int64 %d", m.MessageId, rabbitmq.HeaderFencingToken,
				m.Headers[rabbitmq.HeaderFencingToken], p.FencingToken)
			ok = false
		}
		for k, v := range p.Headers {
			if got, isStr := m.Headers[k].(string); !isStr || got != v {
				t.Errorf("delivery %s: application header %s = %#v, want %q", m.MessageId, k, m.Headers[k], v)
				ok = false
			}
		}
		if !bytes.Equal(m.Body, p.body) {
			t.Errorf("delivery %s: body %q, want %q", m.MessageId, m.Body, p.body)
			ok = false
		}
		if m.ContentType != p.ContentType || m.DeliveryMode != amqp.Persistent || m.Exchange != "" || m.RoutingKey != queue {
			t.Errorf("delivery %s: content type %q, mode %d, exchange %q, routing key %q", m.MessageId,
				m.ContentType, m.DeliveryMode, m.Exchange, m.RoutingKey)
			ok = false
		}
		return ok
	})
	got.Consume(t, s.broker.URL(), queue)
	got.WaitFor(t, accepted, 30*time.Second)
	time.Sleep(time.Second) // a refused or duplicate publication would arrive now
	got.Check(t, accepted, refusedIDs)
	if n := got.Distinct(); n != len(accepted) {
		t.Errorf("%d distinct message ids delivered, want %d", n, len(accepted))
	}
	t.Logf("on the broker: %d publications of the Nim suite delivered with their fence; %d refused ones absent",
		len(accepted), len(refusedIDs))
}
