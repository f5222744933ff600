// Command etcd is etcd's server, built through this wrapper module because etcd's own go.mod
// has relative replaces that `go install module@version` refuses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
