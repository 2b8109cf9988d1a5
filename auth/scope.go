package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/starintel/starlease/lease"
)

// Dimension is a scope dimension.
type Dimension string

// The five scope dimensions, in canonical order.
const (
	DimTenant          Dimension = "tenant"
	DimProgram         Dimension = "program"
	DimTargetNamespace Dimension = "target-namespace"
	DimTarget          Dimension = "target"
	DimActor           Dimension = "actor"
)

// Wildcard is the grant value that matches every value of its dimension.
const Wildcard = "*"

// MaxScopeGrants bounds the number of grants in a scope.
const MaxScopeGrants = 64

// MaxScopeText bounds the text ParseScope accepts.
const MaxScopeText = 16 << 10

var dimensions = [...]Dimension{DimTenant, DimProgram, DimTargetNamespace, DimTarget, DimActor}

// Dimensions lists the scope dimensions in canonical order.
func Dimensions() []Dimension { return dimensions[:] }

func dimIndex(d Dimension) int { return slices.Index(dimensions[:], d) }

// fieldOf names the lock identity field a dimension constrains.
var fieldOf = [...]string{"tenant_id", "program_id", "target_namespace", "target_id", "actor_name"}

// Scope is a set of grants per dimension. Each dimension holds either
// nothing, the wildcard alone, or a sorted set of explicit canonical values.
//
// tenant and program are the ownership boundary: an identity is reached
// only when both grant its value explicitly (a value or "*"), so a scope
// without a tenant or program grant — and the zero Scope — reaches nothing.
// target-namespace, target and actor narrow it: without a grant such a
// dimension is unrestricted, so "tenant:*,program:program-a" reaches every
// lease of program-a in any tenant. Dimensions are independent: "tenant:a,tenant:b,
// program:p" reaches program p in both tenants.
type Scope struct {
	grants [len(dimensions)][]string
}

// ParseScope parses a comma-separated list of grants "dimension:value", for
// example "tenant:*,program:program-a". The value is "*" or an identifier,
// which is normalized with lease.NormalizeIdentifier (so "Program-A" grants
// "program-a"); it may itself contain ':' (the dimension ends at the first
// one). ASCII spaces around items are ignored; duplicates collapse and a
// wildcard absorbs explicit values of its dimension. The empty string is the
// empty scope. Unknown dimensions, empty items and invalid values are errors.
func ParseScope(s string) (Scope, error) {
	if len(s) > MaxScopeText {
		return Scope{}, errors.New("auth: scope text too long")
	}
	if strings.Trim(s, " \t") == "" {
		return Scope{}, nil
	}
	var items []string
	for item := range strings.SplitSeq(s, ",") {
		items = append(items, strings.Trim(item, " \t"))
	}
	return ScopeOf(items...)
}

// ScopeOf builds a scope from grants such as "tenant:*" (see ParseScope).
func ScopeOf(grants ...string) (Scope, error) {
	if len(grants) > MaxScopeGrants {
		return Scope{}, fmt.Errorf("auth: at most %d scope grants", MaxScopeGrants)
	}
	var sc Scope
	for _, g := range grants {
		if g == "" {
			return Scope{}, errors.New("auth: empty scope grant")
		}
		dim, value, ok := strings.Cut(g, ":")
		if !ok {
			return Scope{}, fmt.Errorf("auth: scope grant %q is not dimension:value", clip(g))
		}
		if err := sc.add(Dimension(dim), value); err != nil {
			return Scope{}, err
		}
	}
	return sc, nil
}

// add grants value in dimension d, keeping the dimension canonical.
func (sc *Scope) add(d Dimension, value string) error {
	i := dimIndex(d)
	if i < 0 {
		return fmt.Errorf("auth: unknown scope dimension %q (want tenant, program, target-namespace, target or actor)", clip(string(d)))
	}
	if strings.Trim(value, " \t") == Wildcard {
		value = Wildcard
	} else {
		n, err := lease.NormalizeIdentifier(string(d), value)
		if err != nil {
			return fmt.Errorf("auth: scope grant %s: %s", d, lease.AsError(err).Reason)
		}
		value = n
		if i == 0 && value == lease.InternalTenant {
			return fmt.Errorf("auth: scope grant tenant:%s: reserved for the server's own leases", value)
		}
	}
	cur := sc.grants[i]
	switch {
	case len(cur) == 1 && cur[0] == Wildcard:
		return nil
	case value == Wildcard:
		sc.grants[i] = []string{Wildcard}
	default:
		if j, found := slices.BinarySearch(cur, value); !found {
			sc.grants[i] = slices.Insert(slices.Clone(cur), j, value)
		}
	}
	return nil
}

// Grants returns the canonical grant list: dimensions in canonical order,
// values sorted. It is never nil.
func (sc Scope) Grants() []string {
	out := []string{}
	for i, d := range dimensions {
		for _, v := range sc.grants[i] {
			out = append(out, string(d)+":"+v)
		}
	}
	return out
}

// String is the canonical text, which ParseScope reads back.
func (sc Scope) String() string { return strings.Join(sc.Grants(), ",") }

// IsEmpty reports whether sc has no grant at all.
func (sc Scope) IsEmpty() bool {
	for _, g := range sc.grants {
		if len(g) > 0 {
			return false
		}
	}
	return true
}

// Values returns the grants of one dimension: nil, ["*"], or explicit values.
func (sc Scope) Values(d Dimension) []string {
	if i := dimIndex(d); i >= 0 {
		return slices.Clone(sc.grants[i])
	}
	return nil
}

// ownershipDims counts the leading dimensions (tenant, program) that must
// be granted explicitly.
const ownershipDims = 2

// Missing lists the ownership dimensions (tenant, program) without any
// grant. Such a scope reaches no lock identity; the CLI refuses it.
func (sc Scope) Missing() []Dimension {
	var out []Dimension
	for i, d := range dimensions[:ownershipDims] {
		if len(sc.grants[i]) == 0 {
			out = append(out, d)
		}
	}
	return out
}

// Equal reports whether two scopes hold the same grants.
func (sc Scope) Equal(o Scope) bool {
	for i := range dimensions {
		if !slices.Equal(sc.grants[i], o.grants[i]) {
			return false
		}
	}
	return true
}

// ActorBinding returns the single explicit actor this scope is bound to:
// true only when the actor dimension holds exactly one explicit value.
func (sc Scope) ActorBinding() (string, bool) {
	g := sc.grants[dimIndex(DimActor)]
	if len(g) == 1 && g[0] != Wildcard {
		return g[0], true
	}
	return "", false
}

// grantsValue reports whether dimension i grants v. v must be canonical
// (the caller checks); a value that is not canonical is never granted.
func (sc Scope) grantsValue(i int, v string) bool {
	g := sc.grants[i]
	if len(g) == 1 && g[0] == Wildcard || len(g) == 0 && i >= ownershipDims {
		return true
	}
	_, found := slices.BinarySearch(g, v)
	return found
}

// allowsPrefix checks the first len(values) dimensions against canonical
// values and requires the ownership dimensions among the rest to hold at
// least one grant.
func (sc Scope) allowsPrefix(values ...string) bool {
	if len(values) > 0 && values[0] == lease.InternalTenant {
		return false // the server's own leases: no scope reaches them
	}
	for i, v := range values {
		if n, err := lease.NormalizeIdentifier(fieldOf[i], v); err != nil || n != v {
			return false
		}
		if !sc.grantsValue(i, v) {
			return false
		}
	}
	for i := len(values); i < ownershipDims; i++ {
		if len(sc.grants[i]) == 0 {
			return false
		}
	}
	return true
}

// Allows reports whether sc reaches the lock identity id. id must be
// canonical (as lease.Identity.Normalize returns it); a component that is
// not canonical is denied, even under a wildcard.
func (sc Scope) Allows(id lease.Identity) bool {
	return sc.allowsPrefix(id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName)
}

// AllowsTenant reports whether sc can reach some lease of the canonical tenant.
func (sc Scope) AllowsTenant(tenant string) bool { return sc.allowsPrefix(tenant) }

// AllowsProgram reports whether sc can reach some lease of the canonical
// tenant and program (a list-by-program filter). Individual leases must
// still be checked with Allows unless CoversProgram holds.
func (sc Scope) AllowsProgram(tenant, program string) bool {
	return sc.allowsPrefix(tenant, program)
}

// AllowsTarget reports whether sc can reach some lease of the canonical
// target (a list-by-target filter). Individual leases must still be checked
// with Allows unless CoversTarget holds.
func (sc Scope) AllowsTarget(tenant, program, namespace, target string) bool {
	return sc.allowsPrefix(tenant, program, namespace, target)
}

// CoversProgram reports whether sc reaches every lease of the program: the
// program is allowed and namespace, target and actor are wildcards.
func (sc Scope) CoversProgram(tenant, program string) bool {
	return sc.allowsPrefix(tenant, program) && sc.wildFrom(2)
}

// CoversTarget reports whether sc reaches every lease of the target.
func (sc Scope) CoversTarget(tenant, program, namespace, target string) bool {
	return sc.allowsPrefix(tenant, program, namespace, target) && sc.wildFrom(4)
}

func (sc Scope) wildFrom(i int) bool {
	for ; i < len(dimensions); i++ {
		if g := sc.grants[i]; len(g) != 0 && (len(g) != 1 || g[0] != Wildcard) {
			return false
		}
	}
	return true
}

// MarshalJSON writes the canonical grant list as a JSON array of strings.
func (sc Scope) MarshalJSON() ([]byte, error) { return json.Marshal(sc.Grants()) }

// UnmarshalJSON reads a JSON array of grants; it must already be canonical
// (as MarshalJSON writes it), since stored scopes are never rewritten.
func (sc *Scope) UnmarshalJSON(b []byte) error {
	var gs []string
	if err := json.Unmarshal(b, &gs); err != nil {
		return errors.New("auth: scope must be an array of strings")
	}
	if gs == nil {
		return errors.New("auth: scope must be an array")
	}
	parsed, err := ScopeOf(gs...)
	if err != nil {
		return err
	}
	if !slices.Equal(parsed.Grants(), gs) {
		return errors.New("auth: scope is not canonical")
	}
	*sc = parsed
	return nil
}
