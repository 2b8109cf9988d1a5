// Package auth is starlease's authentication and authorization vocabulary:
// API keys and their verifiers, the server pepper, principals with a class,
// a closed list of capabilities, scope grants, the credential store protocol
// (with a file-per-credential implementation, FileStore, and an in-memory
// one; the Valkey backend keeps credentials in Valkey) and the
// authorization helpers the service applies before any backend work.
//
// # Keys
//
// An API key is "star_sk_v1_<credential-id>_<secret>": the credential id is a
// ULID (26 characters of Crockford base32, upper case), the secret 32 random
// bytes written as 64 lower-case hex characters. The full key is returned
// once, by [Issue] or [Rotate], and never stored: the store keeps a verifier,
// HMAC-SHA-256 keyed by the server [Pepper] over salt ‖ secret, with a
// per-credential 16-byte random salt. The pepper lives in its own file
// ([LoadPepper]) and is never stored with the data.
//
// # Authentication
//
// [Authenticator.Authenticate] takes every value of the request's
// Authorization header. Exactly one value of the form "Bearer <key>" is
// accepted (the scheme is matched case-insensitively, as RFC 9110 says
// authentication schemes are; exactly one space separates it from the key).
// Every failure — no header, several, a malformed value or key, an unknown
// id, a wrong secret, a revoked or expired credential — returns the one value
// [ErrInvalidCredential]. Unknown ids run the same HMAC and constant-time
// comparison against a dummy verifier. There is no cache: every call reads
// the store, so revocation, rotation and expiry apply on the next request.
// The stores reuse the decode of a record only for exactly the bytes it was
// decoded from ([Decodes]).
//
// # Scope
//
// A [Scope] is a list of grants "dimension:value", where the dimension is
// tenant, program, target-namespace, target or actor and the value is a
// canonical identifier (lease.NormalizeIdentifier) or "*". tenant and program
// are the ownership boundary and must be granted explicitly: a scope without
// them (and the empty scope) reaches nothing. target-namespace, target and
// actor narrow a scope; a dimension of those without grants is unrestricted,
// so "tenant:*,program:program-a" reaches every lease of program-a.
//
// workflow_name and operation_class are not scope dimensions.
//
// # Authorization
//
// [Require] checks a capability; [CanForceRelease] needs both
// targets:force-release and the administrator class. [AuthorizeAcquire],
// [AuthorizeHolder], [CanView], [AuthorizeAdmin] and [AuthorizeList] encode
// the lease ownership rules on canonical identities and stored records.
package auth
