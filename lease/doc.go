// Package lease is the vocabulary of the StarIntel target-lease contract: lock
// identities and the one canonical lock-key function, the versioned lease record
// with its strict decoder, the closed set of result codes, the request and result
// types of the lease-store protocol (the Store interface) and idempotency digests.
//
// It imports no backend. Backends (package bolt, package valkey) implement Store;
// package leasetest holds the conformance suite every backend must pass.
package lease
