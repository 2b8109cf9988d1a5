package auth

import (
	"fmt"
	"slices"
	"strings"
)

// Class is a principal's class.
type Class string

// The principal classes. Administrator status is a class of the credential,
// never inferred from an OS user, a source address or a process location.
const (
	ClassAPIClient       Class = "api_client"
	ClassServiceInstance Class = "service_instance"
	// ClassActorComponent must carry an explicit actor binding: exactly one
	// explicit actor grant in its scope, checked when a key is issued.
	ClassActorComponent Class = "actor_component"
	ClassAdministrator  Class = "administrator"
)

// Classes lists every class.
func Classes() []Class {
	return []Class{ClassAPIClient, ClassServiceInstance, ClassActorComponent, ClassAdministrator}
}

// Valid reports whether c is a known class.
func (c Class) Valid() bool { return slices.Contains(Classes(), c) }

// ParseClass parses a class name exactly (no case folding).
func ParseClass(s string) (Class, error) {
	c := Class(s)
	if !c.Valid() {
		return "", fmt.Errorf("auth: unknown principal class %q (want one of api_client, service_instance, actor_component, administrator)", clip(s))
	}
	return c, nil
}

// Capability is one entry of the closed capability list.
type Capability string

// The closed capability list.
const (
	// CapLease: acquire, renew, release, inspect and list of the caller's
	// own leases, within scope.
	CapLease Capability = "targets:lease"
	// CapRead: inspect and list of any lease within scope.
	CapRead Capability = "targets:read"
	// CapForceRelease: force-release and revoke within scope, and only with
	// an administrator credential.
	CapForceRelease Capability = "targets:force-release"
	// CapAuditRead: lease history and audit within scope.
	CapAuditRead Capability = "audit:read"
	// CapCredentialsManage: issue, list, rotate and revoke credentials.
	CapCredentialsManage Capability = "credentials:manage"
)

// Capabilities lists the closed capability list in its canonical order.
func Capabilities() []Capability {
	return []Capability{CapLease, CapRead, CapForceRelease, CapAuditRead, CapCredentialsManage}
}

// Valid reports whether c is on the closed list.
func (c Capability) Valid() bool { return slices.Contains(Capabilities(), c) }

func capRank(c Capability) int { return slices.Index(Capabilities(), c) }

// CanonicalCapabilities checks every capability against the closed list and
// returns them deduplicated in canonical order. Unknown ones are an error.
func CanonicalCapabilities(cs []Capability) ([]Capability, error) {
	out := make([]Capability, 0, len(cs))
	for _, c := range cs {
		if !c.Valid() {
			return nil, fmt.Errorf("auth: unknown capability %q", clip(string(c)))
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b Capability) int { return capRank(a) - capRank(b) })
	return out, nil
}

// ParseCapabilities parses a comma-separated list such as
// "targets:lease,targets:read" (ASCII spaces around items are ignored).
// Unknown and empty items are an error; the result is canonical.
func ParseCapabilities(s string) ([]Capability, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("auth: no capabilities given")
	}
	var cs []Capability
	for item := range strings.SplitSeq(s, ",") {
		item = strings.Trim(item, " \t")
		if item == "" {
			return nil, fmt.Errorf("auth: empty item in the capability list")
		}
		cs = append(cs, Capability(item))
	}
	return CanonicalCapabilities(cs)
}

// clip bounds user input quoted in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
