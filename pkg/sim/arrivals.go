package sim

import (
	"math/rand"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// Arrivals builds the arrival sequence for one seed the way the paper's
// artifact tunes a workload: start from every pod of the list, append pods
// drawn with replacement while the total GPU demand stays within tune x the
// cluster's GPU capacity (or drop random pods while it exceeds it), then
// shuffle. Indices into pods are returned.
func Arrivals(pods []placement.Request, capacityMilli int64, tune float64, seed int64) []int {
	rng := rand.New(rand.NewSource(seed))
	target := tune * float64(capacityMilli)
	seq := make([]int, len(pods))
	var demand int64
	for i := range pods {
		seq[i] = i
		demand += pods[i].GPUDemand()
	}
	for float64(demand) > target && len(seq) > 0 {
		k := rng.Intn(len(seq))
		demand -= pods[seq[k]].GPUDemand()
		seq[k] = seq[len(seq)-1]
		seq = seq[:len(seq)-1]
	}
	for len(pods) > 0 {
		k := rng.Intn(len(pods))
		if float64(demand+pods[k].GPUDemand()) > target {
			break
		}
		demand += pods[k].GPUDemand()
		seq = append(seq, k)
	}
	rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
	return seq
}
