package couchdb

// FenceDesignDocID is the id of the design document InstallFence installs.
const FenceDesignDocID = "_design/starintel_fence"

// FenceField is the member of every fenced document that holds its fence:
// the JSON form of fence.Guard.
const FenceField = "starintel_fence"

// ValidateDocUpdate is the validate_doc_update function of FenceDesignDocID:
// the database side of the fence, run by CouchDB atomically with every
// document write (PUT, POST, DELETE, _bulk_docs, replication). It is
// fence.Admit in JavaScript, plus a ban on deletes:
//
//   - design documents are left alone; every other document is fenced;
//   - a delete is refused, fenced or not (see the package doc: a tombstone
//     would lose the token high-water mark, since CouchDB and pouchdb-server
//     validate the re-creation of a deleted document against no old
//     document);
//   - the new document must carry a complete, well-formed starintel_fence
//     (fence.Guard.Validate: canonical lock key prefix, integer token in
//     1..2^53-1, non-empty lease_id, execution_id, sink and commit_id,
//     trace_id absent or a string, payload_sha256 absent or 64 lower-case
//     hex digits, accepted_at in the exact contract form and not Go's zero
//     instant);
//   - the new fence must be bound to this write (fence.Admit and
//     Guard.Authorizes): a non-empty job_id, and a target equal to the
//     document's _id, so a guard issued for one document never admits a
//     write of another; a job document (type starintel.job) must carry the
//     fence's job_id, so a lease's guard never writes another job's state.
//     The payload digest is checked by the writer before the write (CouchDB's
//     JavaScript has no hash function); a stored fence without target or
//     job_id (written before writes were bound) still orders tokens;
//   - if the stored document has a fence: it must be well formed (else the
//     write fails closed), have the same lock_key, a token not higher than
//     the new one, and, at an equal token, the same lease_id.
//
// A refusal throws {forbidden: "starintel_fence: <reason>"}: HTTP 403 with
// error "forbidden". The reasons carry no field values (another owner's
// token or lease id must not reach a stale holder).
//
// The source is ES5 (no let, arrow functions or template strings) so that
// every CouchDB JavaScript engine runs it: SpiderMonkey 1.8.5 and 91,
// QuickJS, and pouchdb-server's Node sandbox.
const ValidateDocUpdate = `function (newDoc, oldDoc, userCtx, secObj) {
  if (typeof newDoc._id === 'string' && newDoc._id.indexOf('_design/') === 0) {
    return;
  }
  // A lock key: the prefix, then the 43-character base64url SHA-256 whose
  // last character carries no padding bits (lease.CheckLockKey).
  var LOCK_KEY = /^starintel:target-lease:v1:[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$/;
  var MAX_TOKEN = 9007199254740991;
  var SHA256 = /^[0-9a-f]{64}$/;
  var TS = /^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$/;
  function deny(reason) {
    throw({forbidden: 'starintel_fence: ' + reason});
  }
  function nonEmpty(v) {
    return typeof v === 'string' && v.length > 0;
  }
  function timestamp(v) {
    if (typeof v !== 'string' || !TS.test(v) || v === '0001-01-01T00:00:00.000Z') {
      return false;
    }
    var d = new Date(v);
    return !isNaN(d.getTime()) && d.toISOString() === v;
  }
  // problem returns why f is not a complete fence, or '' if it is one.
  function problem(f) {
    if (typeof f !== 'object' || f === null || Array.isArray(f)) {
      return 'the write carries no fence';
    }
    if (typeof f.lock_key !== 'string' || !LOCK_KEY.test(f.lock_key)) {
      return 'the write carries no fence (lock key missing or malformed)';
    }
    var t = f.fencing_token;
    if (typeof t !== 'number' || t % 1 !== 0 || t < 1 || t > MAX_TOKEN) {
      return 'the fencing token is out of range';
    }
    if (!nonEmpty(f.lease_id) || !nonEmpty(f.execution_id) || !nonEmpty(f.sink) || !nonEmpty(f.commit_id)) {
      return 'the fence is incomplete';
    }
    if (f.trace_id !== undefined && f.trace_id !== null && typeof f.trace_id !== 'string') {
      return 'the fence is incomplete';
    }
    if (f.payload_sha256 !== undefined && (typeof f.payload_sha256 !== 'string' || !SHA256.test(f.payload_sha256))) {
      return 'the fence is incomplete';
    }
    if (!timestamp(f.accepted_at)) {
      return 'the fence has no accepted_at';
    }
    return '';
  }
  if (newDoc._deleted === true) {
    deny('a fenced document cannot be deleted');
  }
  var next = newDoc.starintel_fence;
  var bad = problem(next);
  if (bad !== '') {
    deny(bad);
  }
  if (!nonEmpty(next.target) || !nonEmpty(next.job_id)) {
    deny('the fence names no write or job');
  }
  if (next.target !== newDoc._id) {
    deny('the fence was authorized for another document');
  }
  if (newDoc.type === 'starintel.job' && newDoc.job_id !== next.job_id) {
    deny('the fence was issued for another job');
  }
  if (!oldDoc) {
    return;
  }
  var stored = oldDoc.starintel_fence;
  if (stored === undefined || stored === null) {
    return;
  }
  if (problem(stored) !== '') {
    deny('the stored fence is malformed');
  }
  if (stored.lock_key !== next.lock_key) {
    deny('the document belongs to a different lock key');
  }
  if (next.fencing_token < stored.fencing_token) {
    deny('fencing token is lower than the stored token');
  }
  if (next.fencing_token === stored.fencing_token && next.lease_id !== stored.lease_id) {
    deny('fencing token belongs to another lease');
  }
}`

// fenceReasons are the refusals ValidateDocUpdate throws, after its
// "starintel_fence: " prefix. A 403 whose reason is one of them is the
// fence's refusal (commit_rejected); any other 403 is access control.
var fenceReasons = map[string]bool{
	"a fenced document cannot be deleted":                        true,
	"the write carries no fence":                                 true,
	"the write carries no fence (lock key missing or malformed)": true,
	"the fencing token is out of range":                          true,
	"the fence is incomplete":                                    true,
	"the fence has no accepted_at":                               true,
	"the stored fence is malformed":                              true,
	"the document belongs to a different lock key":               true,
	"fencing token is lower than the stored token":               true,
	"fencing token belongs to another lease":                     true,
	"the fence names no write or job":                            true,
	"the fence was authorized for another document":              true,
	"the fence was issued for another job":                       true,
}

const fenceReasonPrefix = "starintel_fence: "
