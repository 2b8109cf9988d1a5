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
//     trace_id absent or a string, accepted_at in the exact contract form
//     and not Go's zero instant);
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
}

const fenceReasonPrefix = "starintel_fence: "
