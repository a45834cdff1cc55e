package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
)

// newFaultsCmd is for a node's operator: inject and recover faults of fake GPUs, and clear
// the faults the kubelet plugin latched on any GPU. Run it on the node, or in the plugin's
// pod (kubectl exec), where the directories are.
func newFaultsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "faults",
		Short: "Inject, recover and clear GPU faults on this node",
		Long:  "Inject, recover and clear GPU faults on this node (docs/faults.md).",
	}
	var devDir string
	var index int
	inject := &cobra.Command{
		Use:   "inject FAULT",
		Short: `Put a fake GPU into a fault: "xid <n>", "ecc-dbe", "lost", "row-remap-failure", "thermal" or "power"`,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return fake.InjectFault(devDir, index, strings.Join(args, " "))
		},
	}
	recoverCmd := &cobra.Command{
		Use:   "recover",
		Short: "Take every injected fault off a fake GPU",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return fake.RemoveFaults(devDir, index) },
	}
	for _, c := range []*cobra.Command{inject, recoverCmd} {
		c.Flags().StringVar(&devDir, "dev-dir", "/var/run/fgpu/fake-dev", "the fake GPUs' device directory (the plugin's --dev-root)")
		c.Flags().IntVar(&index, "gpu", 0, "the fake GPU's index")
	}
	var dataDir string
	clearCmd := &cobra.Command{
		Use:   "clear DEVICE|all",
		Short: "Tell the kubelet plugin to forget a GPU's latched faults (XID, ECC) and its back-off after repeated faults, e.g. after a GPU reset",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := plugin.ClearFaultsDir(dataDir)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			name := filepath.Base(args[0])
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "asked the plugin to clear %s; it does so within its health poll, with a Node event %s\n", name, plugin.ReasonGPUFaultCleared)
			return nil
		},
	}
	clearCmd.Flags().StringVar(&dataDir, "plugin-data-dir", "/var/lib/kubelet/plugins/"+api.DriverName, "the kubelet plugin's data directory (its --plugin-data-dir)")
	cmd.AddCommand(inject, recoverCmd, clearCmd)
	return cmd
}
