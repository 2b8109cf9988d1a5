package lease

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"strings"
)

// ListFilter is a validated List filter: the index it walks and the
// canonical value it matches.
type ListFilter struct {
	By    ListBy
	Value string // canonical, unambiguous encoding of the filter values
}

func (f ListFilter) tokenScope() string { return string(f.By) + "\x00" + f.Value }

// NextPageToken is the opaque token of the page after cursor "after".
func (f ListFilter) NextPageToken(after string) string { return EncodePageToken(after, f.tokenScope()) }

func historyTokenScope(lockKey string) string { return "history\x00" + lockKey }

// HistoryPageToken is the opaque token of the history page of lockKey that
// starts at cursor "at".
func HistoryPageToken(lockKey, at string) string {
	return EncodePageToken(at, historyTokenScope(lockKey))
}

// PrepareList validates a list request and returns its filter, the decoded
// cursor ("" for the first page) and the effective page size.
func PrepareList(req ListRequest, o StoreOptions) (ListFilter, string, int, error) {
	o = o.WithDefaults()
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return ListFilter{}, "", 0, err
	}
	var f ListFilter
	switch req.By {
	case ListByOwner:
		if err := CheckOpaqueID("owner_principal_id", req.OwnerPrincipalID); err != nil {
			return f, "", 0, err
		}
		if req.TenantID != "" || req.ProgramID != "" || req.TargetNamespace != "" || req.TargetID != "" {
			return f, "", 0, Invalid("owner_principal_id", "list by owner takes no target fields")
		}
		f = ListFilter{ListByOwner, OwnerIndexValue(req.OwnerPrincipalID)}
	case ListByTarget, ListByProgram:
		if req.OwnerPrincipalID != "" {
			return f, "", 0, Invalid("owner_principal_id", "list by target or program takes no owner")
		}
		id := Identity{TenantID: req.TenantID, ProgramID: req.ProgramID, TargetNamespace: req.TargetNamespace, TargetID: req.TargetID}
		if req.By == ListByProgram {
			if req.TargetNamespace != "" || req.TargetID != "" {
				return f, "", 0, Invalid("target_id", "list by program takes no target fields")
			}
			id.TargetNamespace, id.TargetID = "x", "x" // placeholders, not part of the filter
		}
		id.ActorName = "x"
		n, err := id.Normalize(o.OperationClasses)
		if err != nil {
			// List filters are top-level query fields, not a lock_identity.
			le := *AsError(err)
			le.Field = strings.TrimPrefix(le.Field, "lock_identity.")
			return f, "", 0, &le
		}
		if req.By == ListByProgram {
			f = ListFilter{ListByProgram, ProgramIndexValue(n)}
		} else {
			f = ListFilter{ListByTarget, TargetIndexValue(n)}
		}
	default:
		return f, "", 0, Invalid("by", "must be owner, target or program")
	}
	size, err := pageSize(req.PageSize, o.MaxPageSize)
	if err != nil {
		return f, "", 0, err
	}
	after, err := DecodePageToken(req.PageToken, f.tokenScope())
	return f, after, size, err
}

func pageSize(n, max int) (int, error) {
	switch {
	case n == 0:
		return max, nil
	case n < 0 || n > max:
		return 0, Invalid("page_size", "must be between 1 and "+strconv.Itoa(max))
	}
	return n, nil
}

// PrepareHistory validates a history request.
func PrepareHistory(req HistoryRequest, o StoreOptions) (HistoryRequest, string, string, int, error) {
	o = o.WithDefaults()
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return req, "", "", 0, err
	}
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, "", "", 0, err
	}
	req.Identity = id
	size, err := pageSize(req.PageSize, o.MaxPageSize)
	if err != nil {
		return req, "", "", 0, err
	}
	after, err := DecodePageToken(req.PageToken, historyTokenScope(key))
	return req, key, after, size, err
}

// The index values of List filters. Each is the length-prefixed encoding of
// canonical components, so no two filters share a value.
func OwnerIndexValue(principal string) string { return lengthPrefixed(principal) }

// TargetIndexValue is the by-target index value of a canonical identity.
func TargetIndexValue(id Identity) string {
	return lengthPrefixed(id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID)
}

// ProgramIndexValue is the by-program index value of a canonical identity.
func ProgramIndexValue(id Identity) string { return lengthPrefixed(id.TenantID, id.ProgramID) }

func lengthPrefixed(parts ...string) string {
	var b []byte
	for _, p := range parts {
		b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
		b = append(b, p...)
	}
	return string(b)
}

// Page tokens are opaque to callers: base64url of a small versioned JSON
// object binding the cursor to its filter, so a token cannot be replayed
// against another filter or forged into a pattern.
type pageToken struct {
	V int    `json:"v"`
	F string `json:"f"`
	A string `json:"a"`
}

// MaxPageTokenBytes bounds an encoded page token.
const MaxPageTokenBytes = 1024

func filterTag(scope string) string {
	return (&fieldHasher{}).add("filter", scope).b64()[:16]
}

// EncodePageToken encodes cursor "after" for the filter scope.
func EncodePageToken(after, scope string) string {
	b, _ := json.Marshal(pageToken{V: 1, F: filterTag(scope), A: after})
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodePageToken decodes a token minted by EncodePageToken for the same
// filter scope. "" decodes to "" (first page).
func DecodePageToken(tok, scope string) (string, error) {
	if tok == "" {
		return "", nil
	}
	if len(tok) > MaxPageTokenBytes {
		return "", Invalid("page_token", "too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", Invalid("page_token", "malformed")
	}
	var p pageToken
	if err := strictUnmarshal(b, &p); err != nil || p.V != 1 || p.A == "" {
		return "", Invalid("page_token", "malformed")
	}
	if p.F != filterTag(scope) {
		return "", Invalid("page_token", "does not belong to this filter")
	}
	return p.A, nil
}
