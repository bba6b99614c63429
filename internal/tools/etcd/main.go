// Command etcd builds the etcd server at the version this module requires,
// for the project's tests: Debian's etcd is older than the versions
// capacityd and the etcd election require (docs/ops/etcd-election.md).
// It is not part of any release.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
