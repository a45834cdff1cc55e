// Command kubectl-fgpu is the cluster views of the fgpu CLI (internal/cli) as a kubectl
// plugin: on the PATH, `kubectl fgpu gpus|why|top|quota|recommendations|report|wake` runs it.
package main

import "github.com/fgpu-dev/fgpu/internal/cli"

func main() { cli.Main(cli.NewRoot("kubectl-fgpu", "kubectl fgpu")) }
