// Command etcd is etcd's own server main, built from the module proxy for the local test cluster.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
