package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func newWakeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wake [deployment/|statefulset/]NAME",
		Short: "Scale a workload fgpu scaled to zero back up",
		Long: `Scales a Deployment (the default) or StatefulSet that fgpu's allocator scaled to zero
for idle GPU use back to the replicas it had, as recorded in its ` + api.AnnotationScaledDownReplicas + `
annotation. The allocator then drops the annotations and the quota the workload kept is
released to its new pods' claims.`,
		Args: cobra.ExactArgs(1),
	}
	kf := addKubeFlags(cmd, namespaceScope)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		client, _, ns, err := kf.target()
		if err != nil {
			return err
		}
		kind, name := "deployment", args[0]
		if k, n, ok := strings.Cut(args[0], "/"); ok {
			kind, name = strings.ToLower(k), n
		}
		replicas, err := wake(cmd.Context(), client, ns, kind, name)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s/%s scaled to %d replicas\n", kind, name, replicas)
		return err
	}
	return cmd
}

// wake scales the workload to the replicas recorded when fgpu scaled it down, and returns them.
func wake(ctx context.Context, client kubernetes.Interface, ns, kind, name string) (int32, error) {
	var annotations map[string]string
	var current int32
	switch kind {
	case "deployment", "deployments", "deploy":
		kind = "deployment"
		d, err := client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		annotations, current = d.Annotations, ptr.Deref(d.Spec.Replicas, 1)
	case "statefulset", "statefulsets", "sts":
		kind = "statefulset"
		s, err := client.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		annotations, current = s.Annotations, ptr.Deref(s.Spec.Replicas, 1)
	default:
		return 0, fmt.Errorf("%s: fgpu scales only deployments and statefulsets", kind)
	}
	raw, ok := annotations[api.AnnotationScaledDownReplicas]
	if !ok {
		return 0, fmt.Errorf("%s/%s in namespace %s was not scaled down by fgpu (no %s annotation)", kind, name, ns, api.AnnotationScaledDownReplicas)
	}
	replicas, err := strconv.ParseInt(raw, 10, 32)
	if err != nil || replicas < 1 {
		return 0, fmt.Errorf("%s/%s: annotation %s=%q is not a replica count: scale it yourself (kubectl scale)", kind, name, api.AnnotationScaledDownReplicas, raw)
	}
	if current > 0 {
		return 0, fmt.Errorf("%s/%s already has %d replicas", kind, name, current)
	}
	patch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas))
	if kind == "deployment" {
		_, err = client.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "scale")
	} else {
		_, err = client.AppsV1().StatefulSets(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "scale")
	}
	return int32(replicas), err
}
