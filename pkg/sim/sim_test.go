package sim

import (
	"encoding/csv"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

const nodesCSV = `sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,96000,393216,8,G2
`

func TestReadBadInput(t *testing.T) {
	bad := map[string]string{
		"empty":          "",
		"missing column": "name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n",
		"truncated row":  "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1\n",
		"not a number":   "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,lots,1024,1,500\n",
		"milli too big":  "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,1500\n",
		"negative":       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,-1,1024,1,500\n",
		"gpus, no milli": "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,2,0\n",
		"header only":    "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n",
	}
	for name, in := range bad {
		if _, err := ReadPods(strings.NewReader(in)); err == nil {
			t.Errorf("pods %s: accepted", name)
		}
	}
	badNodes := map[string]string{
		"truncated": "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2\n",
		"no model":  "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,\n",
		"too many":  "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,100,T4\n",
	}
	for name, in := range badNodes {
		if _, err := ReadNodes(strings.NewReader(in)); err == nil {
			t.Errorf("nodes %s: accepted", name)
		}
	}
	if _, err := LoadPods("/nonexistent.csv"); err == nil {
		t.Error("missing file accepted")
	}
}

func TestReadPods(t *testing.T) {
	in := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" +
		"a,1000,1024,1,460,\nb,2000,1024,2,1000,V100M16|V100M32\nc,500,10,0,0,\n"
	pods, err := ReadPods(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if pods[0].Share != 460 || ClassOf(&pods[0]) != Fractional {
		t.Errorf("a: %+v", pods[0])
	}
	if !pods[1].Whole() || len(pods[1].Models) != 2 || ClassOf(&pods[1]) != MultiGPU || pods[1].GPUDemand() != 2000 {
		t.Errorf("b: %+v", pods[1])
	}
	if ClassOf(&pods[2]) != CPUOnly {
		t.Errorf("c: %+v", pods[2])
	}
}

// Pods asking for an unknown model or for more than any node has are counted
// failures with their reason, never a crash.
func TestRunCountsImpossiblePods(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader(nodesCSV))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := ReadPods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" +
		"ok,1000,1024,1,500,\nghost,1000,1024,1,500,B200\nhuge,1000,1024,16,1000,\nfat,999000,1024,1,1000,\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range placement.Names() {
		for _, batch := range []int{1, 4} {
			r, err := Run(Config{Nodes: nodes, Pods: pods, Policy: pol, Seed: 1, Tune: 5, Batch: batch})
			if err != nil {
				t.Fatalf("%s: %v", pol, err)
			}
			if len(r.Decisions) != r.Placed+r.Failed[CPUOnly]+r.Failed[Fractional]+r.Failed[OneGPU]+r.Failed[MultiGPU] {
				t.Errorf("%s batch %d: %d decisions for %d pods", pol, batch, len(r.Decisions), r.Placed)
			}
			if r.Reasons[placement.ReasonNoModel.String()] == 0 || r.Reasons[placement.ReasonTooLarge.String()] == 0 {
				t.Errorf("%s: reasons %v", pol, r.Reasons)
			}
			if r.Placed == 0 {
				t.Errorf("%s: nothing placed", pol)
			}
		}
	}
}

func TestArrivalsReachTune(t *testing.T) {
	pods := []placement.Request{{GPUs: 1, Share: 300}, {GPUs: 1}, {GPUs: 4}, {CPUMilli: 1}}
	capa := int64(100 * 1000)
	a := Arrivals(pods, capa, 1.3, 42)
	var d int64
	for _, k := range a {
		d += pods[k].GPUDemand()
	}
	if float64(d) > 1.3*float64(capa) || float64(d) < 1.3*float64(capa)-4000 {
		t.Fatalf("arrived demand %d for target %.0f", d, 1.3*float64(capa))
	}
	b := Arrivals(pods, capa, 1.3, 42)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed, different arrivals")
		}
	}
}

// The harness must reproduce the FGD paper's published figures before any
// comparison means something. One seed per case keeps this test short; a
// single seed's result scatters around the 10-seed mean by the published
// std, so the tolerance is 0.5 points (the target) plus 3 published stds.
// It fails, for instance, with the artifact's 95% typical-pod cut (FGD drops
// to ~90%), with per-node BestFit normalisation, or with random instead of
// smallest-name ties (FGD on gpushare80 drops to ~86.5%).
func TestReproducesPublishedFigures(t *testing.T) {
	dir, nodes, pub := openb(t)
	for _, c := range []struct{ workload, pol, key string }{
		{"default", "fgd", "06-FGD"},
		{"default", "bestfit", "05-BestFit"},
		{"gpushare80", "fgd", "06-FGD"},
	} {
		got := replay42(t, dir, nodes, c.workload, c.pol)
		want := pub["openb_pod_list_"+c.workload+"/"+c.key]
		tol := 0.5 + 3*want[1]
		t.Logf("%s %s: %.2f%% at 130%%, published %.2f ± %.2f", c.workload, c.pol, got, want[0], want[1])
		if math.Abs(got-want[0]) > tol {
			t.Errorf("%s %s: %.2f%%, published %.2f%% (tolerance %.2f)", c.workload, c.pol, got, want[0], tol)
		}
	}
}

// fgpu's default policy clears the bar, FGD's published mean + 0.5
// points, on seed 42 of default and gpushare80 (10-seed figures in
// docs/placement.md). Without the LP packing loss (PackPrice) it falls
// short on both.
func TestFGPUBeatsPublishedFGD(t *testing.T) {
	dir, nodes, pub := openb(t)
	for _, w := range []string{"default", "gpushare80"} {
		got := replay42(t, dir, nodes, w, "fgpu")
		want := pub["openb_pod_list_"+w+"/06-FGD"][0] + 0.5
		t.Logf("%s fgpu: %.2f%% at 130%%, FGD published + 0.5 = %.2f", w, got, want)
		if got < want {
			t.Errorf("%s fgpu: %.2f%%, want at least %.2f%%", w, got, want)
		}
	}
}

// openb loads the openb GPU nodes and the published figures, skipping the
// test in -short mode or when the traces are absent outside CI.
func openb(t *testing.T) (string, []placement.NodeSpec, map[string][2]float64) {
	t.Helper()
	if testing.Short() {
		t.Skip("replays the openb trace")
	}
	// The traces live in shared/, beside the repository (in CI too).
	dir := "../../../shared/traces/openb/"
	if _, err := os.Stat(dir); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("traces not found at %s: %v", dir, err)
		}
		t.Skip("traces not available")
	}
	nodes, err := LoadNodes(dir + "openb_node_list_gpu_node.csv")
	if err != nil {
		t.Fatal(err)
	}
	return dir, nodes, published(t, dir+"fgd_published_results.csv")
}

// replay42 is the allocation ratio (percent) at 130% for seed 42.
func replay42(t *testing.T, dir string, nodes []placement.NodeSpec, workload, pol string) float64 {
	t.Helper()
	pods, err := LoadPods(dir + "openb_pod_list_" + workload + ".csv")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(Config{Nodes: nodes, Pods: pods, Policy: pol, Seed: 42, Tune: 1.3})
	if err != nil {
		t.Fatal(err)
	}
	return 100 * r.AllocAt(1.3)
}

func published(t *testing.T, path string) map[string][2]float64 {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, r := range rows[1:] {
		m, _ := strconv.ParseFloat(r[4], 64)
		s, _ := strconv.ParseFloat(r[5], 64)
		out[r[0]+"/"+r[1]] = [2]float64{m, s}
	}
	return out
}
