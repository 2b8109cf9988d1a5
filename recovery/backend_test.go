package recovery

import (
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/valkey"
)

// Every backend is recovery's Backend, with the same names; Valkey and
// etcd namespaces can be sealed (after a failover, or a cluster restored
// from its own snapshot) and hold their own audit streams.
var (
	_ Backend = (*bolt.Namespace)(nil)
	_ Backend = (*valkey.Namespace)(nil)
	_ Backend = (*etcd.Namespace)(nil)
	_ Sealer  = (*valkey.Namespace)(nil)
	_ Sealer  = (*etcd.Namespace)(nil)
	_ Auditor = (*valkey.Namespace)(nil)
	_ Auditor = (*etcd.Namespace)(nil)
)
