// Command fgpu is fgpu's command-line tool (internal/cli); cmd/kubectl-fgpu is the same
// tool as a kubectl plugin.
package main

import "github.com/fgpu-dev/fgpu/internal/cli"

func main() { cli.Main("fgpu", "fgpu") }
