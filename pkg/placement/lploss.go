package placement

import (
	"math"
	"slices"

	"github.com/fgpu-dev/fgpu/pkg/binpack"
)

// lpLoss prices GPU shares with the cutting-stock LP over a workload's
// sharing shapes and says what a placement loses against the best packing:
// putting share s on a GPU with h free loses value(h) - price(s) -
// value(h-s), where value(g) is the most price that fits in a gap of g.
type lpLoss struct {
	price map[int64]float64
	// steps are ascending CPU amounts, vals[i] the gap values using only
	// the shares whose smallest pod needs at most steps[i] CPU. Without CPU
	// awareness there is one step that every node passes.
	steps []int64
	vals  [][]float64
	// byCPU[k][h] is the most price that fits in a gap of h when its pods
	// may use k*cpuStep CPU in all, each share's pods at their mean CPU;
	// cpuNeed[h] is the least CPU that reaches a gap's full value. Nil
	// unless withNodeValues was called.
	byCPU   [][]float64
	cpuNeed []int64
	// byMem and memNeed are the same over memory (MiB).
	byMem   [][]float64
	memNeed []int64
	order   []int // scratch for nodeValue
}

// newLPLoss solves the LP for w's sharing shapes, their weights scaled to
// many pods so that it describes the steady mix. byCPU makes a gap worth
// only what the CPU beside it can host.
func newLPLoss(w Workload, byCPU bool) *lpLoss {
	counts := map[int64]float64{}
	minCPU := map[int64]int64{}
	for _, s := range w {
		if s.GPUs != 1 || s.Share <= 0 || s.Share >= DefaultGPUCapacity {
			continue
		}
		counts[s.Share] += s.Weight * 1e4
		if c, ok := minCPU[s.Share]; !ok || s.CPUMilli < c {
			minCPU[s.Share] = s.CPUMilli
		}
	}
	sol := binpack.Solve(counts, DefaultGPUCapacity)
	l := &lpLoss{price: map[int64]float64{}}
	for i, sz := range sol.Sizes {
		l.price[sz] = sol.Price[i]
	}
	if !byCPU {
		l.steps = []int64{math.MinInt64}
		l.vals = [][]float64{sol.Values(DefaultGPUCapacity)}
		return l
	}
	for _, c := range minCPU {
		l.steps = append(l.steps, c)
	}
	slices.Sort(l.steps)
	l.steps = slices.Compact(l.steps)
	for _, t := range l.steps {
		var sub binpack.Solution
		for i, sz := range sol.Sizes {
			if minCPU[sz] <= t {
				sub.Sizes = append(sub.Sizes, sz)
				sub.Price = append(sub.Price, sol.Price[i])
			}
		}
		l.vals = append(l.vals, sub.Values(DefaultGPUCapacity))
	}
	return l
}

// value is what a gap of h is worth on a node with cpu free CPU.
func (l *lpLoss) value(h, cpu int64) float64 {
	i, _ := slices.BinarySearch(l.steps, cpu+1)
	if i == 0 {
		return 0
	}
	return l.vals[i-1][h]
}

// loss is the LP reduced cost, rounded to 1/1000 GPU, of putting share s on
// a GPU of capacity capa with h free, on a node whose free CPU goes from
// cpuBefore to cpuAfter. A share the workload does not have is priced at
// what the workload's shares could fill in its place.
func (l *lpLoss) loss(h, s, capa, cpuBefore, cpuAfter int64) float64 {
	if capa != DefaultGPUCapacity || len(l.vals) == 0 {
		return 0
	}
	return math.Round(max(0, l.value(h, cpuBefore)-l.priceOf(s)-l.value(h-s, cpuAfter))*1000) / 1000
}

// cpuStep is the CPU resolution of the node values (half a core: openb's
// pods ask for whole cores or 3.152 and 4.152).
const cpuStep = 500

// memStep is the memory resolution of the node values, 1 GiB.
const memStep = 1024

// withNodeValues adds the two-dimensional gap values: one knapsack over
// share and CPU up to maxCPU, one over share and memory up to maxMem (the
// largest node's), with one item per share of w's one-GPU shapes, at its LP
// price (one GPU for a whole GPU) and at its pods' mean CPU and memory. The
// mean is what a gap will need: the thriftiest pod of a share would call a
// CPU-starved gap still fillable (openb's 470m pods ask for 4 to 11.9
// cores). The whole-GPU item keeps a free GPU's value honest: a GPU whose
// CPU is gone is worth nothing to a whole-GPU pod either, so placing one
// there does not hide the gaps its CPU strands. Multi-GPU shapes are
// FGD's to protect.
func (l *lpLoss) withNodeValues(w Workload, maxCPU, maxMem int64) {
	cpu, mem, weight := map[int64]float64{}, map[int64]float64{}, map[int64]float64{}
	for _, sh := range w {
		if sh.GPUs == 1 && sh.Share > 0 && sh.Weight > 0 {
			share := min(sh.Share, DefaultGPUCapacity)
			cpu[share] += sh.Weight * float64(sh.CPUMilli)
			mem[share] += sh.Weight * float64(sh.MemoryMiB)
			weight[share] += sh.Weight
		}
	}
	var byCPU, byMem []item
	for share := range weight {
		price := 1.0
		if share < DefaultGPUCapacity {
			price = l.price[share]
		}
		if price > 0 {
			byCPU = append(byCPU, item{int(share), int(math.Ceil(cpu[share] / weight[share] / cpuStep)), price})
			byMem = append(byMem, item{int(share), int(math.Ceil(mem[share] / weight[share] / memStep)), price})
		}
	}
	l.byCPU, l.cpuNeed = knapsack(byCPU, maxCPU, cpuStep)
	l.byMem, l.memNeed = knapsack(byMem, maxMem, memStep)
}

// item is one share in a gap-value knapsack: its size, what else it needs
// (in steps of the table) and its price.
type item struct {
	share, need int
	price       float64
}

// knapsack builds table[k][h], the most price that fits in a gap of h when
// its pods may use k steps of the other resource in all (up to most units),
// and need[h], the least of it that reaches a gap's full value.
func knapsack(items []item, most, step int64) (table [][]float64, need []int64) {
	// No gap's pods use more than the hungriest fill of a whole GPU.
	var hungriest int64
	for _, it := range items {
		hungriest = max(hungriest, int64(DefaultGPUCapacity/it.share*it.need)*step)
	}
	steps := int(min(most, hungriest)/step) + 1
	table = make([][]float64, 0, steps)
	for k := range steps {
		row := make([]float64, DefaultGPUCapacity+1)
		for h := 1; h <= DefaultGPUCapacity; h++ {
			row[h] = row[h-1]
			if k > 0 {
				row[h] = max(row[h], table[k-1][h])
			}
			for _, it := range items {
				if it.share > h || it.need > k {
					continue
				}
				from := row // a pod needing none of it stays on this row
				if it.need > 0 {
					from = table[k-it.need]
				}
				row[h] = max(row[h], from[h-it.share]+it.price)
			}
		}
		table = append(table, row)
	}
	need = make([]int64, DefaultGPUCapacity+1)
	full := table[steps-1]
	for h := range need {
		k := steps - 1
		for k > 0 && table[k-1][h] >= full[h]-1e-9 {
			k--
		}
		need[h] = int64(k) * step
	}
	return table, need
}

// nodeValue is what a node's free shares are worth with cpu free CPU and mem
// free memory. The gaps share both: each takes what its best fill needs,
// smallest gap first, so whole free GPUs get what the partly used ones
// leave, and is worth the lesser of its values under its CPU and under its
// memory. GPUs whose capacity is not 1000 units are not counted.
func (l *lpLoss) nodeValue(free, capa []int64, cpu, mem int64) float64 {
	order := l.order[:0]
	for g, h := range free {
		if h <= 0 || capa[g] != DefaultGPUCapacity {
			continue
		}
		order = append(order, g)
		j := len(order) - 1
		for ; j > 0 && free[order[j-1]] > h; j-- {
			order[j] = order[j-1]
		}
		order[j] = g
	}
	l.order = order
	var v float64
	for _, g := range order {
		h := free[g]
		c := max(0, min(cpu, l.cpuNeed[h]))
		m := max(0, min(mem, l.memNeed[h]))
		v += min(l.byCPU[min(int(c/cpuStep), len(l.byCPU)-1)][h], l.byMem[min(int(m/memStep), len(l.byMem)-1)][h])
		cpu -= c
		mem -= m
	}
	return v
}

// priceOf is the LP price of share s; a share the workload does not have is
// priced at what the workload's shares could fill in its place (nothing
// when it has no sharing shapes).
func (l *lpLoss) priceOf(s int64) float64 {
	if p, ok := l.price[s]; ok {
		return p
	}
	if len(l.vals) == 0 {
		return 0
	}
	return l.vals[len(l.vals)-1][s]
}

// nodeLoss is what a placement costs the node beyond the price of what it
// placed (before: the node's value before it), rounded to 1/1000 GPU.
func (l *lpLoss) nodeLoss(before float64, free, capa []int64, cpu, mem int64, price float64) float64 {
	return math.Round(max(0, before-price-l.nodeValue(free, capa, cpu, mem))*1000) / 1000
}
