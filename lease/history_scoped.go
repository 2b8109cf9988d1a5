package lease

import (
	"bytes"
	"strings"
)

// History version 4 ("hv4"; Valkey from stored format 5) is version 2
// without its hash tag line (the key the entry is stored under holds it)
// and with the idempotency scopes of the evidence that refers to the
// entry (evidence version 3: an ending's evidence of the lease's
// acquisition and a release's own) on two lines after the version: the
// acquisition's scope and the release's, each empty or the scope itself. The store
// rewrites that evidence in version 2 before it drops the entry, and
// names the evidence keys by these lines: its server-side library cannot
// compute a scope (a SHA-256). Each line must be empty or exactly the
// scope the entry's own facts give (IdempotencyScope: the owner and
// request id of the acquisition; ended_by and request_id of a release),
// so a damaged line fails decoding like any other.
//
//	hv4\n<acquisition scope>\n<release scope>\n<version 2's five ending lines>\n<version 2's lines after the tag>
const HistoryScopedPrefix = "hv4\n"

// DecodeScopedHistory strictly decodes a stored history entry of version
// 1, 2 or 4 found under a key that holds lockKey (version 4: its scope
// lines checked and removed, lockKey's hash tag put back, then read as
// DecodeStoredHistory reads version 2).
func DecodeScopedHistory(raw []byte, lockKey string) (*HistoryEntry, error) {
	if !bytes.HasPrefix(raw, []byte(HistoryScopedPrefix)) {
		return DecodeStoredHistory(raw)
	}
	var f [9]string // version, two scopes, five ending lines, the rest
	tag, ok := strings.CutPrefix(lockKey, KeyPrefix)
	if !ok || !splitLines(string(raw), f[:]) {
		return nil, corrupt("history: version 4 entry is malformed")
	}
	acquisition, release := f[1], f[2]
	if acquisition == "" && release == "" {
		return nil, corrupt("history: version 4 entry names no evidence") // written as version 2
	}
	h, err := DecodeStoredHistory([]byte(HistoryV2Prefix + strings.Join(f[3:8], "\n") + "\n" + tag + "\n" + f[8]))
	if err == nil && h.Record.LockKey != lockKey {
		err = corrupt("history: version 4 entry of a foreign lock key")
	}
	if err != nil {
		return nil, err
	}
	if acquisition != "" && acquisition != h.EvidenceScope(OpAcquire) {
		return nil, corrupt("history: version 4 entry's acquisition scope is not its own")
	}
	if release != "" && (h.Record.State != StateReleased || h.EndedBy == "" || h.RequestID == "" ||
		release != h.EvidenceScope(OpRelease)) {
		return nil, corrupt("history: version 4 entry's release scope is not its own")
	}
	return h, nil
}
