package allocator

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

// buildKubectlFgpu builds the kubectl-fgpu plugin from this tree into a directory of its own.
func buildKubectlFgpu(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir, "./cmd/kubectl-fgpu")
	build.Dir = framework.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kubectl-fgpu: %v: %s", err, out)
	}
	return dir
}

// kubectlFgpu runs `kubectl fgpu ARGS` as a user would: the real kubectl finds the plugin
// in dir on its PATH.
func kubectlFgpu(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), framework.Bin("kubectl"), append([]string{"fgpu"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+framework.Kubeconfig(), "PATH="+dir+string(filepath.ListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl fgpu %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("kubectl fgpu %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// checkKubectlFgpuOverQuota: with p1 and p2 running in ns at its 20Gi quota and p3 waiting
// for quota, `kubectl fgpu` says why p3 waits, shows p1's share and the namespace's quota.
func checkKubectlFgpuOverQuota(t *testing.T, ns string) {
	t.Helper()
	dir := buildKubectlFgpu(t)
	why := strings.Join(strings.Fields(kubectlFgpu(t, dir, "why", "p3", "-n", ns)), " ")
	for _, want := range []string{"Pod " + ns + "/p3: WaitingGPU", "over the GPU memory quota of namespace " + ns, "10Gi over", "FgpuOverQuota"} {
		if !strings.Contains(why, want) {
			t.Errorf("kubectl fgpu why p3 does not say %q", want)
		}
	}
	if gpus := kubectlFgpu(t, dir, "gpus"); !strings.Contains(gpus, ns+"/p1") || !strings.Contains(gpus, ns+"/p2") {
		t.Errorf("kubectl fgpu gpus does not show p1's and p2's shares")
	}
	var quotas []clusterview.NamespaceQuota
	if err := json.Unmarshal([]byte(kubectlFgpu(t, dir, "quota", "-n", ns, "-o", "json")), &quotas); err != nil {
		t.Fatal(err)
	}
	if len(quotas) != 1 || quotas[0].MemoryQuota == nil || *quotas[0].MemoryQuota != 20<<30 || quotas[0].MemoryUsed != 20<<30 ||
		quotas[0].MemoryFrom != "e2e-quota" || quotas[0].Placed != 2 || quotas[0].Waiting != 1 {
		t.Errorf("kubectl fgpu quota: %+v; want 20Gi of 20Gi (e2e-quota), 2 placed, 1 waiting", quotas)
	}
	var shares []clusterview.ShareUse
	if err := json.Unmarshal([]byte(kubectlFgpu(t, dir, "top", "-n", ns, "-o", "json")), &shares); err != nil {
		t.Fatal(err)
	}
	if len(shares) != 2 || shares[0].MemoryCap != 10<<30 {
		t.Errorf("kubectl fgpu top: %+v; want p1's and p2's 10Gi shares", shares)
	}
}
