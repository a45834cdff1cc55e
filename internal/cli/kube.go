package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
)

// kubeFlags are kubectl's connection flags (--kubeconfig, --context, -n, --server, ...) from
// client-go's clientcmd, the same names and meanings kubectl gives them, so that `kubectl
// fgpu` reads as any kubectl command does.
type kubeFlags struct {
	rules     *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
	all       bool // -A
	config    clientcmd.ClientConfig
	scope     scope
}

// scope is what a command looks at, which says which namespace flags it takes.
type scope int

const (
	clusterScope   scope = iota // no -n: the view is of the cluster
	namespaceScope              // -n
	anyNamespace                // -n or -A
	namespaceOrAll              // -n, else every namespace: a report on the cluster, narrowed
)

// addKubeFlags binds the connection flags to cmd, with the namespace flags of its scope.
func addKubeFlags(cmd *cobra.Command, sc scope) *kubeFlags {
	f := &kubeFlags{rules: clientcmd.NewDefaultClientConfigLoadingRules(), scope: sc}
	fl := cmd.Flags()
	fl.StringVar(&f.rules.ExplicitPath, "kubeconfig", "", "kubeconfig (default $KUBECONFIG or ~/.kube/config)")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	if sc == clusterScope {
		names.ContextOverrideFlags.Namespace.LongName = "" // not bound: a flag that did nothing would mislead
	}
	clientcmd.BindOverrideFlags(&f.overrides, fl, names)
	if sc == anyNamespace {
		fl.BoolVarP(&f.all, "all-namespaces", "A", false, "every namespace")
	}
	f.config = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(f.rules, &f.overrides)
	return f
}

// clients are the Kubernetes and fgpu clientsets of the chosen cluster.
func (f *kubeFlags) clients() (kubernetes.Interface, versioned.Interface, error) {
	cfg, err := f.config.ClientConfig()
	if err != nil {
		return nil, nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	fc, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return kc, fc, nil
}

// namespace is the namespace to look in: "" with -A, or without -n where that means every
// namespace, else -n or the context's (as kubectl).
func (f *kubeFlags) namespace() (string, error) {
	if f.all || (f.scope == namespaceOrAll && f.overrides.Context.Namespace == "") {
		return "", nil
	}
	ns, _, err := f.config.Namespace()
	return ns, err
}

// target is the clientsets of the chosen cluster and the namespace the command looks in ("" for
// every namespace, or for a view of the cluster).
func (f *kubeFlags) target() (kubernetes.Interface, versioned.Interface, string, error) {
	kc, fc, err := f.clients()
	if err != nil || f.scope == clusterScope {
		return kc, fc, "", err
	}
	ns, err := f.namespace()
	return kc, fc, ns, err
}

// view is what a read-only command gathers for the namespace in scope, and how it prints as
// a table.
type view func(ctx context.Context, kc kubernetes.Interface, fc versioned.Interface, ns string, args []string) (any, func(io.Writer) error, error)

// viewCmd makes cmd a read-only view: the connection flags of its scope, -o, and what v
// gathers, written as a table or as data.
func viewCmd(cmd *cobra.Command, sc scope, v view) *cobra.Command {
	kf := addKubeFlags(cmd, sc)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		kc, fc, ns, err := kf.target()
		if err != nil {
			return err
		}
		data, table, err := v(cmd.Context(), kc, fc, ns, args)
		if err != nil {
			return err
		}
		return write(cmd.OutOrStdout(), *out, data, table)
	}
	return cmd
}

// addOutputFlag adds -o: a table for people (the default), json or yaml for scripts.
func addOutputFlag(cmd *cobra.Command) *string {
	var o string
	cmd.Flags().StringVarP(&o, "output", "o", "", "output format: json or yaml (default: a table)")
	return &o
}

// write prints v as format asks, or as table does.
func write(w io.Writer, format string, v any, table func(io.Writer) error) error {
	switch format {
	case "":
		return table(w)
	case "json":
		raw, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(raw, '\n'))
		return err
	case "yaml":
		raw, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(raw)
		return err
	default:
		return fmt.Errorf("unknown output format %q: use json or yaml", format)
	}
}
