package recovery

import (
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/valkey"
)

// Both backends are recovery's Backend, with the same names; only Valkey
// namespaces fail over (Seal) and hold their own audit stream.
var (
	_ Backend = (*bolt.Namespace)(nil)
	_ Backend = (*valkey.Namespace)(nil)
	_ Sealer  = (*valkey.Namespace)(nil)
	_ Auditor = (*valkey.Namespace)(nil)
)
