// Package lease is the vocabulary of the StarIntel target-lease contract: lock
// identities and the one canonical lock-key function, the versioned lease record
// with its strict decoder, the closed set of result codes, the request and result
// types of the lease-store protocol (the Store interface) and idempotency digests.
//
// Metadata (ValidateMetadata) is a small object of non-secret labels: a request
// whose metadata names a credential in a key or holds credential material in a
// value (SecretShaped, the same rule package audit redacts by) is refused, since
// metadata is stored in records and history as given.
//
// It imports no backend. Backends (package bolt, package valkey) implement Store;
// package leasetest holds the conformance suite every backend must pass.
package lease
