// Command allocator-bench drives a burst of claims against a cluster whose allocator is
// running and reports throughput and claim-created→allocated latency:
//
//	go run ./test/performance/cmd/allocator-bench --kubeconfig _output/cluster/kubeconfig --cleanup
//
// It publishes fake GPU nodes (Node objects and fenced ResourceSlices, no kubelet) first;
// see test/performance/loadgen. With --allocator-pid (the allocator runs on this machine,
// as on the local cluster) or --allocator-metrics it also reports the allocator's CPU and
// API writes over the burst, per claim placed:
//
//	go run ./test/performance/cmd/allocator-bench --kubeconfig _output/cluster/kubeconfig --cleanup \
//	  --allocator-pid $(pgrep -f -o fgpu-allocator)
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/fgpu-dev/fgpu/pkg/serve"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := command().ExecuteContext(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "allocator-bench:", err)
		os.Exit(1)
	}
}

func command() *cobra.Command {
	o := loadgen.Defaults()
	var kubeconfig string
	var setup, burst, cleanup bool
	var alloc loadgen.Allocator
	var tokenFile string
	cmd := &cobra.Command{
		Use:           "allocator-bench",
		Short:         "Publish fake GPU nodes, create a burst of claims with pods, report allocation throughput and latency",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rc, err := serve.RestConfig(kubeconfig, "fgpu-allocator-bench", 500, 1000)
			if err != nil {
				return err
			}
			c, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if setup {
				if err := loadgen.Setup(ctx, c, o); err != nil {
					return fmt.Errorf("setup: %w", err)
				}
			}
			if burst {
				if tokenFile != "" {
					b, err := os.ReadFile(tokenFile)
					if err != nil {
						return err
					}
					alloc.Token = strings.TrimSpace(string(b))
				}
				measure := alloc.PID > 0 || alloc.MetricsURL != ""
				var before loadgen.Usage
				if measure {
					if before, err = alloc.Read(ctx); err != nil {
						return fmt.Errorf("allocator usage: %w", err)
					}
				}
				rep, err := loadgen.Burst(ctx, c, o)
				if err != nil {
					return fmt.Errorf("burst: %w", err)
				}
				fmt.Println(rep)
				if measure {
					after, err := alloc.Read(ctx)
					if err != nil {
						return fmt.Errorf("allocator usage: %w", err)
					}
					fmt.Println(loadgen.PerClaim(before, after, rep.Allocated))
				}
				if rep.InvariantErr != nil || rep.Allocated < rep.Claims {
					if cleanup {
						_ = loadgen.Cleanup(ctx, c, o)
					}
					return errors.New("bench failed")
				}
			}
			if cleanup {
				return loadgen.Cleanup(ctx, c, o)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster)")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "fake GPU nodes (Node objects and slices, no kubelet)")
	fs.IntVar(&o.GPUsPerNode, "gpus-per-node", o.GPUsPerNode, "GPUs per node")
	fs.StringVar(&o.GPUMemory, "gpu-memory", o.GPUMemory, "allocatable memory per GPU")
	fs.IntVar(&o.Claims, "claims", o.Claims, "claims in the burst")
	fs.StringSliceVar(&o.Sizes, "sizes", o.Sizes, "claim memory sizes, used in turn")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "namespace of the claims and pods")
	fs.StringVar(&o.Prefix, "prefix", o.Prefix, "prefix of node, claim and pod names")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "parallel creators")
	fs.BoolVar(&o.Pods, "pods", o.Pods, "create a pod per claim")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "wait at most this long for allocations")
	fs.StringVar(&o.Driver, "driver", o.Driver, "driver name of the fake slices (another name than the real driver's keeps the bench apart from real claims; run the allocator with the same --driver-name)")
	fs.StringVar(&o.Class, "class", o.Class, "DeviceClass of the claims (created when missing, selecting --driver)")
	fs.BoolVar(&setup, "setup", true, "create the fake nodes and slices first")
	fs.BoolVar(&burst, "burst", true, "create the claims and measure")
	fs.BoolVar(&cleanup, "cleanup", false, "delete the namespace, slices and nodes afterwards")
	fs.IntVar(&alloc.PID, "allocator-pid", 0, "the allocator's process ID on this machine: report its CPU per claim placed (from /proc/<pid>/stat)")
	fs.StringVar(&alloc.MetricsURL, "allocator-metrics", "", "the allocator's /metrics URL: report its CPU (unless --allocator-pid) and API writes per claim placed")
	fs.StringVar(&tokenFile, "allocator-metrics-token-file", "", "bearer token for --allocator-metrics (a metrics reader's)")
	fs.BoolVar(&alloc.Insecure, "allocator-metrics-insecure-skip-tls-verify", false, "do not verify the certificate of --allocator-metrics (self-signed by default)")
	return cmd
}
