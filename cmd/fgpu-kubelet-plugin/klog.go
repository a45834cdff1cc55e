package main

import (
	"flag"

	"k8s.io/klog/v2"
)

// goflagSet exposes klog's flags (-v, --vmodule, ...) on the command line.
func goflagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(fs)
	return fs
}
