package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func TestWriteFormats(t *testing.T) {
	v := []clusterview.ShareUse{{Namespace: "a", Claim: "c", Pods: []string{"p"}, GPU: "n1/gpu-0", Mode: "mps", MemoryCap: 10 << 30, ComputeCap: 25}}
	table := func(w io.Writer) error { _, err := io.WriteString(w, "TABLE\n"); return err }
	for format, decode := range map[string]func([]byte, any) error{"json": json.Unmarshal, "yaml": func(b []byte, o any) error { return yaml.Unmarshal(b, o) }} {
		var out bytes.Buffer
		if err := write(&out, format, v, table); err != nil {
			t.Fatal(err)
		}
		var back []clusterview.ShareUse
		if err := decode(out.Bytes(), &back); err != nil || len(back) != 1 || back[0].MemoryCap != 10<<30 || back[0].GPU != "n1/gpu-0" {
			t.Errorf("-o %s: %v %+v\n%s", format, err, back, out.String())
		}
	}
	var out bytes.Buffer
	if err := write(&out, "", v, table); err != nil || out.String() != "TABLE\n" {
		t.Errorf("table: %v %q", err, out.String())
	}
	if err := write(&out, "wide", v, table); err == nil || !strings.Contains(err.Error(), "json or yaml") {
		t.Errorf("unknown format: %v", err)
	}
}

// The kubectl plugin's commands take kubectl's flags, and -A only where it means something.
func TestKubectlFlags(t *testing.T) {
	root := NewRoot("kubectl-fgpu", "kubectl fgpu")
	for _, tc := range []struct {
		cmd       string
		namespace bool
		all       bool
	}{{"gpus", false, false}, {"why", true, false}, {"top", true, true}, {"quota", true, true}, {"recommendations", true, true}, {"report", true, false}} {
		c, _, err := root.Find([]string{tc.cmd})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"kubeconfig", "context", "output", "as"} {
			if c.Flags().Lookup(f) == nil {
				t.Errorf("%s lacks --%s", tc.cmd, f)
			}
		}
		if got := c.Flags().ShorthandLookup("n") != nil; got != tc.namespace {
			t.Errorf("%s: -n %v, want %v", tc.cmd, got, tc.namespace)
		}
		if got := c.Flags().ShorthandLookup("A") != nil; got != tc.all {
			t.Errorf("%s: -A %v, want %v", tc.cmd, got, tc.all)
		}
	}
	var help bytes.Buffer
	root.SetOut(&help)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "kubectl fgpu [command]") {
		t.Errorf("usage does not say kubectl fgpu:\n%s", help.String())
	}
	for _, line := range strings.Split(help.String(), "\n") {
		if len([]rune(line)) > 80 {
			t.Errorf("help line over 80 columns: %q", line)
		}
	}
}

// A report is on the whole cluster unless -n narrows it, whatever the context's namespace;
// top follows kubectl: the context's namespace unless -n or -A.
func TestNamespaceDefaults(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "config")
	const config = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-b}}]
current-context: x
`
	if err := os.WriteFile(kubeconfig, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	for _, tc := range []struct {
		sc   scope
		args []string
		want string
	}{
		{namespaceOrAll, nil, ""},
		{namespaceOrAll, []string{"-n", "team-a"}, "team-a"},
		{anyNamespace, nil, "team-b"},
		{anyNamespace, []string{"-A"}, ""},
		{anyNamespace, []string{"-n", "team-a"}, "team-a"},
	} {
		cmd := &cobra.Command{Use: "x"}
		f := addKubeFlags(cmd, tc.sc)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		if ns, err := f.namespace(); err != nil || ns != tc.want {
			t.Errorf("scope %d %v: namespace %q, %v; want %q", tc.sc, tc.args, ns, err, tc.want)
		}
	}
}
