// Package sizingsim replays measured per-container GPU use (the genai_v2026 trace) online
// against sizing strategies, to compare the GPUs each needs and how often each hurts a
// container: `fgpu sim sizing`.
package sizingsim

import (
	"archive/tar"
	"compress/gzip"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// Container is one container's use, one value per trace step from Start on while it runs.
type Container struct {
	ID    string
	Start int
	// Memory is the GPU memory used at each step (bytes); SM the duty cycle in percent, -1
	// where the trace has none.
	Memory []int64
	SM     []int
}

// Trace is the containers on a common clock of Steps steps of StepSeconds.
type Trace struct {
	StepSeconds float64
	Steps       int
	Containers  []Container
}

// LoadGenAI reads genai_v2026's memory and duty-cycle archives from dir.
func LoadGenAI(dir string) (*Trace, error) {
	type point struct {
		t float64
		v float64
	}
	mem, sm := map[string][]point{}, map[string][]point{}
	read := func(file string, into map[string][]point) error {
		return readTarCSV(filepath.Join(dir, file), func(h map[string]int, rec []string) error {
			t, err1 := strconv.ParseFloat(rec[h["timestamp_anon"]], 64)
			v, err2 := strconv.ParseFloat(rec[h["value"]], 64)
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			id := rec[h["container_ip"]]
			into[id] = append(into[id], point{t, v})
			return nil
		})
	}
	if err := read("pod_gpu_memory_used_bytes_anon.tar.gz", mem); err != nil {
		return nil, err
	}
	if err := read("pod_gpu_duty_cycle_anon.tar.gz", sm); err != nil {
		return nil, err
	}
	t0, t1, step := 0.0, 0.0, 0.0
	var times []float64
	for _, ps := range mem {
		for _, p := range ps {
			times = append(times, p.t)
		}
	}
	if len(times) == 0 {
		return nil, fmt.Errorf("no memory samples in %s", dir)
	}
	sort.Float64s(times)
	t0, t1 = times[0], times[len(times)-1]
	for i := 1; i < len(times); i++ {
		if d := times[i] - times[i-1]; d > 0 && (step == 0 || d < step) {
			step = d
		}
	}
	if step == 0 {
		step = 60
	}
	idx := func(t float64) int { return int((t-t0)/step + 0.5) }
	tr := &Trace{StepSeconds: step, Steps: idx(t1) + 1}
	ids := make([]string, 0, len(mem))
	for id := range mem {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		ps := mem[id]
		sort.Slice(ps, func(i, j int) bool { return ps[i].t < ps[j].t })
		first, last := idx(ps[0].t), idx(ps[len(ps)-1].t)
		c := Container{ID: id, Start: first, Memory: make([]int64, last-first+1), SM: make([]int, last-first+1)}
		for i := range c.SM {
			c.SM[i] = -1
		}
		for _, p := range ps {
			c.Memory[idx(p.t)-first] = int64(p.v)
		}
		// A missing sample holds the last one seen.
		for i := 1; i < len(c.Memory); i++ {
			if c.Memory[i] == 0 {
				c.Memory[i] = c.Memory[i-1]
			}
		}
		for _, p := range sm[id] {
			if i := idx(p.t) - first; i >= 0 && i < len(c.SM) {
				c.SM[i] = min(100, max(0, int(p.v+0.5)))
			}
		}
		tr.Containers = append(tr.Containers, c)
	}
	return tr, nil
}

// readTarCSV calls fn for each record of the CSV files in a .tar.gz, with the header's columns.
func readTarCSV(path string, fn func(header map[string]int, rec []string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if hdr.Typeflag != tar.TypeReg || filepath.Ext(hdr.Name) != ".csv" {
			continue
		}
		r := csv.NewReader(tr)
		head, err := r.Read()
		if err != nil {
			return fmt.Errorf("%s/%s: %w", path, hdr.Name, err)
		}
		h := map[string]int{}
		for i, name := range head {
			h[name] = i
		}
		for _, col := range []string{"timestamp_anon", "value", "container_ip"} {
			if _, ok := h[col]; !ok {
				return fmt.Errorf("%s/%s: no column %q", path, hdr.Name, col)
			}
		}
		for {
			rec, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("%s/%s: %w", path, hdr.Name, err)
			}
			if err := fn(h, rec); err != nil {
				return fmt.Errorf("%s/%s: %w", path, hdr.Name, err)
			}
		}
	}
}
