// Package sim replays the FGD paper's protocol (Alibaba openb traces: pods
// arrive until their GPU demand reaches a multiple of the cluster's GPUs,
// nothing departs) against any placement policy and measures the GPU
// allocation ratio as demand grows.
package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// LoadNodes reads an openb node list (sn,cpu_milli,memory_mib,gpu,model).
func LoadNodes(path string) ([]placement.NodeSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	nodes, err := ReadNodes(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return nodes, nil
}

// ReadNodes parses an openb node list.
func ReadNodes(r io.Reader) ([]placement.NodeSpec, error) {
	rows, col, err := readTable(r, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	nodes := make([]placement.NodeSpec, 0, len(rows))
	for i, row := range rows {
		line := i + 2
		cpu, err1 := parseInt(row[col["cpu_milli"]], 0, 1<<40)
		mem, err2 := parseInt(row[col["memory_mib"]], 0, 1<<40)
		gpus, err3 := parseInt(row[col["gpu"]], 0, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		model := strings.TrimSpace(row[col["model"]])
		if gpus > 0 && model == "" {
			return nil, fmt.Errorf("line %d: node with %d GPUs has no model", line, gpus)
		}
		n := placement.NodeSpec{Name: row[col["sn"]], CPUMilli: cpu, MemoryMiB: mem}
		for g := 0; g < int(gpus); g++ {
			n.GPUs = append(n.GPUs, placement.GPUSpec{Model: model, Capacity: placement.DefaultGPUCapacity})
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, errors.New("no nodes")
	}
	return nodes, nil
}

// LoadPods reads an openb pod list
// (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]).
func LoadPods(path string) ([]placement.Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pods, err := ReadPods(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pods, nil
}

// ReadPods parses an openb pod list. A whole-GPU pod (gpu_milli 1000) becomes
// a request for whole GPUs; a GPU-sharing pod a request for a share.
func ReadPods(r io.Reader) ([]placement.Request, error) {
	rows, col, err := readTable(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	spec, hasSpec := col["gpu_spec"]
	pods := make([]placement.Request, 0, len(rows))
	for i, row := range rows {
		line := i + 2
		cpu, err1 := parseInt(row[col["cpu_milli"]], 0, 1<<40)
		mem, err2 := parseInt(row[col["memory_mib"]], 0, 1<<40)
		n, err3 := parseInt(row[col["num_gpu"]], 0, 64)
		milli, err4 := parseInt(row[col["gpu_milli"]], 0, placement.DefaultGPUCapacity)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if n > 0 && milli == 0 {
			return nil, fmt.Errorf("line %d: %d GPUs with gpu_milli 0", line, n)
		}
		p := placement.Request{Name: row[col["name"]], CPUMilli: cpu, MemoryMiB: mem, GPUs: int(n)}
		if n > 0 && milli < placement.DefaultGPUCapacity {
			p.Share = milli
		}
		if hasSpec && n > 0 {
			for _, m := range strings.Split(row[spec], "|") {
				if m = strings.TrimSpace(m); m != "" {
					p.Models = append(p.Models, m)
				}
			}
		}
		pods = append(pods, p)
	}
	if len(pods) == 0 {
		return nil, errors.New("no pods")
	}
	return pods, nil
}

// readTable reads a CSV with a header row that has at least the named
// columns; every row must have as many fields as the header.
func readTable(r io.Reader, need ...string) ([][]string, map[string]int, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = false
	head, err := cr.Read()
	if err == io.EOF {
		return nil, nil, errors.New("empty file")
	}
	if err != nil {
		return nil, nil, err
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, n := range need {
		if _, ok := col[n]; !ok {
			return nil, nil, fmt.Errorf("header lacks column %q", n)
		}
	}
	rows, err := cr.ReadAll()
	if err != nil {
		return nil, nil, err
	}
	return rows, col, nil
}

func parseInt(s string, lo, hi int64) (int64, error) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not an integer: %q", s)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%d out of range [%d, %d]", v, lo, hi)
	}
	return v, nil
}

// Replicate is a fleet of k copies of nodes, each copy's names prefixed with its number
// (r00-, r01-, …, so the list stays in name order): the openb node list grown to the
// size of a large cluster.
func Replicate(nodes []placement.NodeSpec, k int) []placement.NodeSpec {
	out := make([]placement.NodeSpec, 0, k*len(nodes))
	for r := 0; r < k; r++ {
		for _, n := range nodes {
			n.Name = fmt.Sprintf("r%02d-%s", r, n.Name)
			n.GPUs = append([]placement.GPUSpec(nil), n.GPUs...)
			out = append(out, n)
		}
	}
	return out
}
