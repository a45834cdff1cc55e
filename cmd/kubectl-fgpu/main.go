// Command kubectl-fgpu is the fgpu CLI (internal/cli) as a kubectl plugin: on the PATH,
// `kubectl fgpu gpus|why|top|quota` runs it.
package main

import "github.com/fgpu-dev/fgpu/internal/cli"

func main() { cli.Main("kubectl-fgpu", "kubectl fgpu") }
