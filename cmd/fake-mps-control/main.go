// Command fake-mps-control stands in for nvidia-cuda-mps-control where there is no GPU.
package main

import (
	"os"

	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

func main() { os.Exit(fakecontrol.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
