// Command etcdserver is etcd's server (go.etcd.io/etcd/server/v3's etcdmain)
// at the version go.mod pins, built by internal/testenv for tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
