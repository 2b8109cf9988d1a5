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
//     Guard.Authorizes): a non-empty job_id, a commit_seq in 1..2^53-1, and
//     a target equal to the document's _id, so a guard issued for one
//     document never admits a write of another. The payload digest is
//     checked by the writer before the write: a canonical form of a JSON
//     body is not something two languages agree on byte for byte;
//   - a typed document (an id starting target:, result:, schedule: or job:,
//     or a type naming one of the StarIntel document types in any case)
//     must have exactly its type and the id its content names, and its
//     lock_identity must hash to the fence's lock_key (the canonical
//     lock-key function, SHA-256 in this function): a lease's guard never
//     writes another identity's target, result, schedule or job document;
//     a job document must also carry the fence's job_id, an opaque id, and
//     have the id job:<identity>~<job_id>, so a guard never writes another
//     job's state, and a lease of another identity that claims the same
//     job id never writes (or first creates) this identity's job document.
//     The old form job:<job_id> is refused, creation included;
//   - if the stored document has a fence: it must be well formed (else the
//     write fails closed), have the same lock_key, a token not higher than
//     the new one, and, at an equal token, the same lease_id and a higher
//     commit_seq (a stored fence without one, from before writes were
//     bound, counts as 0): the lease's earlier or same authorization never
//     lands over its later one, so a replay rolls nothing back, and a raw
//     write that copies the stored fence, or adds an attachment, is
//     refused.
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
  // The canonical lock-key function (lease.CanonicalLockKey) over an
  // already-canonical tuple: SHA-256 of the UTF-8 of the JSON array
  // ["v1", the seven components], unpadded base64url, with the prefix.
  // Canonical components are letters, digits and . _ : - only, so the
  // array needs no escaping; anything that would need it is refused.
  var K = [0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2];
  function rotr(x, n) {
    return (x >>> n) | (x << (32 - n));
  }
  // sha256 of a string of byte values (0..255); returns 32 byte values.
  function sha256(bytes) {
    var H = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    var l = bytes.length, blocks = ((l + 8) >> 6) + 1, m = [], w = [], i, j, t;
    for (i = 0; i < blocks * 16; i++) {
      m[i] = 0;
    }
    for (i = 0; i < l; i++) {
      m[i >> 2] |= bytes.charCodeAt(i) << (24 - (i % 4) * 8);
    }
    m[l >> 2] |= 0x80 << (24 - (l % 4) * 8);
    m[blocks * 16 - 1] = l * 8;
    for (j = 0; j < blocks * 16; j += 16) {
      var a = H[0], b = H[1], c = H[2], d = H[3], e = H[4], f = H[5], g = H[6], h = H[7];
      for (t = 0; t < 64; t++) {
        if (t < 16) {
          w[t] = m[j + t] | 0;
        } else {
          var s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >>> 3);
          var s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >>> 10);
          w[t] = (w[t - 16] + s0 + w[t - 7] + s1) | 0;
        }
        var t1 = (h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t]) | 0;
        var t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
        h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
      }
      H[0] = (H[0] + a) | 0; H[1] = (H[1] + b) | 0; H[2] = (H[2] + c) | 0; H[3] = (H[3] + d) | 0;
      H[4] = (H[4] + e) | 0; H[5] = (H[5] + f) | 0; H[6] = (H[6] + g) | 0; H[7] = (H[7] + h) | 0;
    }
    var out = [];
    for (i = 0; i < 8; i++) {
      out.push((H[i] >>> 24) & 255, (H[i] >>> 16) & 255, (H[i] >>> 8) & 255, H[i] & 255);
    }
    return out;
  }
  var B64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
  function base64url(bytes) {
    var out = '', i, v;
    for (i = 0; i + 2 < bytes.length; i += 3) {
      v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
      out += B64URL.charAt((v >>> 18) & 63) + B64URL.charAt((v >>> 12) & 63) + B64URL.charAt((v >>> 6) & 63) + B64URL.charAt(v & 63);
    }
    if (bytes.length - i === 2) {
      v = (bytes[i] << 16) | (bytes[i + 1] << 8);
      out += B64URL.charAt((v >>> 18) & 63) + B64URL.charAt((v >>> 12) & 63) + B64URL.charAt((v >>> 6) & 63);
    } else if (bytes.length - i === 1) {
      v = bytes[i] << 16;
      out += B64URL.charAt((v >>> 18) & 63) + B64URL.charAt((v >>> 12) & 63);
    }
    return out;
  }
  var COMPONENTS = ['tenant_id', 'program_id', 'target_namespace', 'target_id', 'actor_name', 'workflow_name', 'operation_class'];
  var NOT_CANONICAL = /["\\~\/\s\x00-\x1f\x7f]/;
  // components returns the seven components of a lock identity, or null
  // if it is not a plain object of seven non-empty strings.
  function components(id) {
    if (typeof id !== 'object' || id === null || Array.isArray(id)) {
      return null;
    }
    var parts = [];
    for (var i = 0; i < COMPONENTS.length; i++) {
      var v = id[COMPONENTS[i]];
      if (typeof v !== 'string' || v.length === 0 || v.length > 256 || NOT_CANONICAL.test(v)) {
        return null;
      }
      parts.push(v);
    }
    return parts;
  }
  function lockKeyOf(parts) {
    var utf8;
    try {
      utf8 = unescape(encodeURIComponent('["v1","' + parts.join('","') + '"]'));
    } catch (err) {
      return '';
    }
    var key = 'starintel:target-lease:v1:' + base64url(sha256(utf8));
    return key;
  }
  // The typed StarIntel documents: id prefix and type (couchdb/points.go).
  var TYPED = [['target:', 'starintel.target_state'], ['result:', 'starintel.result'],
    ['schedule:', 'starintel.schedule'], ['job:', 'starintel.job']];
  // An opaque id's alphabet (lease.CheckOpaqueID): a job id.
  var OPAQUE_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]*$/;
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
    var q = f.commit_seq;
    if (q !== undefined && (typeof q !== 'number' || q % 1 !== 0 || q < 1 || q > MAX_TOKEN)) {
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
  if (!nonEmpty(next.target) || !nonEmpty(next.job_id) || next.commit_seq === undefined) {
    deny('the fence names no write or job');
  }
  if (next.target !== newDoc._id) {
    deny('the fence was authorized for another document');
  }
  for (var k = 0; k < TYPED.length; k++) {
    var byID = newDoc._id.indexOf(TYPED[k][0]) === 0;
    var byType = typeof newDoc.type === 'string' && newDoc.type.toLowerCase() === TYPED[k][1];
    if (!byID && !byType) {
      continue;
    }
    if (!byID || newDoc.type !== TYPED[k][1]) {
      deny('a typed document needs its exact type and id');
    }
    var parts = components(newDoc.lock_identity);
    if (parts === null || lockKeyOf(parts) !== next.lock_key) {
      deny('the document belongs to another lock identity');
    }
    var want = TYPED[k][0] + parts.join('~');
    if (TYPED[k][0] === 'job:') {
      if (newDoc.job_id !== next.job_id) {
        deny('the fence was issued for another job');
      }
      // job:<identity>~<job_id>: the same job id under another identity
      // is another document, and the old form job:<job_id> is never
      // written again. A job id is an opaque id (no "~").
      want = OPAQUE_ID.test(next.job_id) && next.job_id.length <= 256 ? want + '~' + next.job_id : '';
    } else if (TYPED[k][0] === 'result:') {
      want = typeof newDoc.name === 'string' ? want + '~' + newDoc.name : '';
    }
    if (newDoc._id !== want) {
      deny('the document id does not match its content');
    }
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
  if (next.fencing_token === stored.fencing_token && next.commit_seq <= (stored.commit_seq || 0)) {
    deny('the document already holds this or a later commit of the lease');
  }
}`

// fenceReasons are the refusals ValidateDocUpdate throws, after its
// "starintel_fence: " prefix. A 403 whose reason is one of them is the
// fence's refusal (commit_rejected); any other 403 is access control.
var fenceReasons = map[string]bool{
	"a fenced document cannot be deleted":                            true,
	"the write carries no fence":                                     true,
	"the write carries no fence (lock key missing or malformed)":     true,
	"the fencing token is out of range":                              true,
	"the fence is incomplete":                                        true,
	"the fence has no accepted_at":                                   true,
	"the stored fence is malformed":                                  true,
	"the document belongs to a different lock key":                   true,
	"fencing token is lower than the stored token":                   true,
	"fencing token belongs to another lease":                         true,
	"the fence names no write or job":                                true,
	"the fence was authorized for another document":                  true,
	"the fence was issued for another job":                           true,
	"a typed document needs its exact type and id":                   true,
	"the document belongs to another lock identity":                  true,
	"the document id does not match its content":                     true,
	"the document already holds this or a later commit of the lease": true,
}

const fenceReasonPrefix = "starintel_fence: "

// laterCommitReason is the fence's refusal of a lease's earlier (or the
// same) commit over its later one: a conflict (ErrConflict), not a loss.
const laterCommitReason = "the document already holds this or a later commit of the lease"
