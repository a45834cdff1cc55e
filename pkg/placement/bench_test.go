package placement

import (
	"fmt"
	"math/rand"
	"testing"
)

// BenchmarkPlace times one decision of the shipped policy on a fleet of openb's size and
// mix (1,000 nodes: 8-GPU machines in two NVLink islands, 2-GPU PCIe ones) filled to
// about 70%, for each kind of request the nodes' wiring changes, on the fleet wired and
// on the same fleet with no wiring named.
func BenchmarkPlace(b *testing.B) {
	w := Workload{{CPUMilli: 4000, GPUs: 1, Share: 300, Weight: .3}, {CPUMilli: 8000, GPUs: 1, Share: 1000, Weight: .3},
		{CPUMilli: 2000, GPUs: 1, Share: 150, Weight: .2}, {CPUMilli: 16000, GPUs: 2, Share: 1000, Weight: .1},
		{CPUMilli: 16000, GPUs: 4, Share: 1000, Weight: .05}, {CPUMilli: 1000, Weight: .05}}
	for _, wiring := range []string{"wired", "blind"} {
		rng := rand.New(rand.NewSource(1))
		specs := make([]NodeSpec, 1000)
		for i := range specs {
			specs[i] = NodeSpec{Name: fmt.Sprintf("n%04d", i), CPUMilli: 96000, MemoryMiB: 393216, GPUs: wiredGPUs("G2", 8, 4, 4)}
			if i%3 == 2 {
				specs[i] = NodeSpec{Name: specs[i].Name, CPUMilli: 32000, MemoryMiB: 65536, GPUs: wiredGPUs("T4", 2, 0, 2)}
			}
			if wiring == "blind" {
				specs[i].GPUs = gpus(specs[i].GPUs[0].Model, len(specs[i].GPUs))
			}
		}
		c, err := NewCluster(specs)
		if err != nil {
			b.Fatal(err)
		}
		s := NewScheduler(c, NewFGPU(w, DefaultOptions()), 1)
		for failed := 0; float64(c.GPUFree()) > 0.3*float64(c.GPUCapacity()) && failed < 100; {
			sh := w[rng.Intn(len(w))]
			r := &Request{CPUMilli: sh.CPUMilli, MemoryMiB: 4096, GPUs: sh.GPUs, Share: sh.Share}
			if _, err := s.Allocate(r); err != nil {
				failed++
			}
		}
		for _, r := range []Request{
			{CPUMilli: 4000, MemoryMiB: 4096, GPUs: 1, Share: 300},
			{CPUMilli: 8000, MemoryMiB: 4096, GPUs: 1},
			{CPUMilli: 16000, MemoryMiB: 4096, GPUs: 4},
		} {
			b.Run(fmt.Sprintf("%s/gpus=%d,share=%d", wiring, r.GPUs, r.Share), func(b *testing.B) {
				for b.Loop() {
					if _, err := s.Place(&r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
