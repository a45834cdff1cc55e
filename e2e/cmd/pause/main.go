// Command pause is the sandbox ("pause") container of the local test cluster: it holds a pod's
// namespaces open and does nothing else. It is built from this repository so the cluster needs no
// registry: e2e/cluster/images.sh packs it as fgpu.dev/pause:dev, which containerd pins as its
// sandbox image.
//
// It sleeps until SIGTERM or SIGINT and, being PID 1 of pods that share their process namespace,
// reaps the zombies that are re-parented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("fgpu pause\n")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
