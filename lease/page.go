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

// FiltersOf are the three List filters that select r: by its owner, its
// target and its program (the index entries a backend keeps for it).
func FiltersOf(r *Record) [3]ListFilter {
	id := r.Identity()
	return [3]ListFilter{
		{By: ListByOwner, Value: OwnerIndexValue(r.OwnerPrincipalID)},
		{By: ListByTarget, Value: TargetIndexValue(id)},
		{By: ListByProgram, Value: ProgramIndexValue(id)},
	}
}

// Selects reports whether f lists r: r's owner, target or program (f.By)
// is f's value. A backend checks it of every record an index entry leads
// to, so an entry left under the wrong filter lists nothing.
func (f ListFilter) Selects(r *Record) bool {
	switch f.By {
	case ListByOwner:
		return OwnerIndexValue(r.OwnerPrincipalID) == f.Value
	case ListByTarget:
		return TargetIndexValue(r.Identity()) == f.Value
	case ListByProgram:
		return ProgramIndexValue(r.Identity()) == f.Value
	}
	return false
}

func historyTokenScope(lockKey string) string { return "history\x00" + lockKey }

// Page is a validated request for one page of List or History: what it
// reads, the cursor it resumes after and its size. Its page tokens are
// bound to what it reads (NextPageToken).
type Page struct {
	// Filter is a List page's filter.
	Filter ListFilter
	// Identity and LockKey are a History page's canonical identity and
	// its lock key.
	Identity Identity
	LockKey  string
	// After is the decoded cursor, "" for the first page.
	After string
	// Size is the effective page size.
	Size int
	// scope binds the page's tokens: the filter, or the history of the
	// lock key.
	scope string
}

// NextPageToken is the opaque token of the page that starts after cursor
// "after" (for History: at it) of what p reads.
func (p Page) NextPageToken(after string) string { return EncodePageToken(after, p.scope) }

// page finishes p: the effective size and the decoded cursor of token,
// bound to scope.
func (p Page) page(scope string, size, max int, token string) (Page, error) {
	var err error
	p.scope = scope
	if p.Size, err = pageSize(size, max); err != nil {
		return Page{}, err
	}
	if p.After, err = DecodePageToken(token, scope); err != nil {
		return Page{}, err
	}
	return p, nil
}

// PrepareList validates a list request and returns its page: the filter,
// the decoded cursor and the effective page size.
func PrepareList(req ListRequest, o StoreOptions) (Page, error) {
	o = o.WithDefaults()
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return Page{}, err
	}
	var f ListFilter
	switch req.By {
	case ListByOwner:
		if err := CheckOpaqueID("owner_principal_id", req.OwnerPrincipalID); err != nil {
			return Page{}, err
		}
		if req.TenantID != "" || req.ProgramID != "" || req.TargetNamespace != "" || req.TargetID != "" {
			return Page{}, Invalid("owner_principal_id", "list by owner takes no target fields")
		}
		f = ListFilter{ListByOwner, OwnerIndexValue(req.OwnerPrincipalID)}
	case ListByTarget, ListByProgram:
		if req.OwnerPrincipalID != "" {
			return Page{}, Invalid("owner_principal_id", "list by target or program takes no owner")
		}
		id := Identity{TenantID: req.TenantID, ProgramID: req.ProgramID, TargetNamespace: req.TargetNamespace, TargetID: req.TargetID}
		if req.By == ListByProgram {
			if req.TargetNamespace != "" || req.TargetID != "" {
				return Page{}, Invalid("target_id", "list by program takes no target fields")
			}
			id.TargetNamespace, id.TargetID = "x", "x" // placeholders, not part of the filter
		}
		id.ActorName = "x"
		n, err := id.Normalize(o.OperationClasses)
		if err != nil {
			// List filters are top-level query fields, not a lock_identity.
			le := *AsError(err)
			le.Field = strings.TrimPrefix(le.Field, "lock_identity.")
			return Page{}, &le
		}
		if req.By == ListByProgram {
			f = ListFilter{ListByProgram, ProgramIndexValue(n)}
		} else {
			f = ListFilter{ListByTarget, TargetIndexValue(n)}
		}
	default:
		return Page{}, Invalid("by", "must be owner, target or program")
	}
	return Page{Filter: f}.page(f.tokenScope(), req.PageSize, o.MaxPageSize, req.PageToken)
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

// PrepareHistory validates a history request and returns its page: the
// canonical identity and its lock key, the decoded cursor and the
// effective page size.
func PrepareHistory(req HistoryRequest, o StoreOptions) (Page, error) {
	o = o.WithDefaults()
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return Page{}, err
	}
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return Page{}, err
	}
	return Page{Identity: id, LockKey: key}.page(historyTokenScope(key), req.PageSize, o.MaxPageSize, req.PageToken)
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
