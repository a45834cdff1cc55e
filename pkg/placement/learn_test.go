package placement

import (
	"math"
	"testing"
)

func TestLearnerDefaultUntilMinSeen(t *testing.T) {
	def := Workload{{GPUs: 1, Share: 500, Weight: 1}}
	l := NewLearner(def, LearnOptions{HalfLife: 100, MinSeen: 3, Every: 2})
	r := &Request{CPUMilli: 4000, MemoryMiB: 1024, GPUs: 1, Share: 250}
	var refresh []bool
	for range 7 {
		refresh = append(refresh, l.Observe(r))
		if l.Seen() < 3 {
			if w := l.Workload(); len(w) != 1 || w[0].Share != 500 {
				t.Fatalf("after %d requests: %+v, want the default", l.Seen(), w)
			}
		}
	}
	want := []bool{false, false, true, false, true, false, true}
	for i := range want {
		if refresh[i] != want[i] {
			t.Fatalf("refresh after each request %v, want %v", refresh, want)
		}
	}
	w := l.Workload()
	if len(w) != 1 || w[0] != (Shape{CPUMilli: 4000, GPUs: 1, Share: 250, Weight: 1, MemoryMiB: 1024}) {
		t.Fatalf("learned %+v", w)
	}
}

// With MinMove, a check hands the workload over only once it moved that far from the one
// handed over last, and the policy keeps measuring against that one until then.
func TestLearnerHandsOverWhatMoved(t *testing.T) {
	l := NewLearner(nil, LearnOptions{HalfLife: 100, MinSeen: 10, Every: 10, MinMove: 0.05})
	a := &Request{CPUMilli: 1000, GPUs: 1, Share: 300}
	b := &Request{CPUMilli: 2000, GPUs: 1, Share: 700}
	var handed []int
	observe := func(r *Request, n int) {
		for range n {
			if l.Observe(r) {
				handed = append(handed, l.Seen())
			}
		}
	}
	observe(a, 40)
	observe(b, 1)
	observe(a, 9) // b's one request is about 2% of the window at the check
	if len(handed) != 1 || handed[0] != 10 {
		t.Fatalf("handed over after %v requests, want only after 10 (the workload did not move)", handed)
	}
	observe(b, 5)
	if w := l.Workload(); len(w) != 1 || w[0].Share != 300 {
		t.Fatalf("between checks the workload is %+v, want the one handed over (a alone)", w)
	}
	observe(b, 5)
	if len(handed) != 2 || handed[1] != 60 {
		t.Fatalf("handed over after %v requests, want also after 60 (b is a fifth of the window)", handed)
	}
	if w := l.Workload(); len(w) != 2 || w[0].Share != 300 || w[1].Share != 700 {
		t.Fatalf("handed over %+v", w)
	}
}

// The window decays: a shape seen a half-life ago weighs half as much as one seen now, and
// one that stopped long ago is forgotten.
func TestLearnerDecays(t *testing.T) {
	l := NewLearner(nil, LearnOptions{HalfLife: 10, MinSeen: 1, Every: 1})
	old := &Request{GPUs: 1, Share: 100}
	cur := &Request{GPUs: 1, Share: 900}
	l.Observe(old)
	for range 9 {
		l.Observe(cur)
	}
	l.Observe(cur)
	w := l.Workload()
	if len(w) != 2 || w[0].Share != 900 || w[1].Share != 100 {
		t.Fatalf("learned %+v", w)
	}
	// old weighs 1, each of the ten later ones 2^(i/10): old's share of the total.
	total := 0.0
	for i := 0; i <= 10; i++ {
		total += math.Exp2(float64(i) / 10)
	}
	if got, want := w[1].Weight, 1/total; math.Abs(got-want) > 1e-9 {
		t.Errorf("old shape's weight %v, want %v", got, want)
	}
	for range 200 {
		l.Observe(cur)
	}
	if w := l.Workload(); len(w) != 1 || w[0].Share != 900 || len(l.shapes) != 1 {
		t.Fatalf("a shape last seen 200 requests ago (20 half-lives) is still kept: %+v", w)
	}
}

// SetPolicy drops the old policy's hooks: they would keep refreshing caches nobody reads,
// and a scheduler that learns its workload replaces its policy again and again.
func TestSetPolicyDropsOldHooks(t *testing.T) {
	c := occupied(t, map[string][]int64{"a": {0, 0}, "b": {500, 0}})
	w := Workload{{GPUs: 1, Share: 250, Weight: 1}}
	other := NewScheduler(c, NewFGD(w), 1)
	s := NewScheduler(c, NewFGPU(w, DefaultOptions()), 1)
	n := len(c.observers)
	for range 5 {
		s.SetPolicy(NewFGPU(w, DefaultOptions()))
	}
	if len(c.observers) != n {
		t.Fatalf("%d observers after replacing the policy, %d before", len(c.observers), n)
	}
	if _, err := other.Allocate(&Request{GPUs: 1, Share: 250}); err != nil {
		t.Fatal(err)
	}
	// The new policy's caches follow the change the other scheduler made.
	fresh := NewFGPU(w, DefaultOptions())
	fresh.Attach(c)
	cur, ok := s.p.(*FGPU)
	if !ok {
		t.Fatalf("policy %T", s.p)
	}
	if got, want := cur.TotalFrag(), fresh.TotalFrag(); got != want {
		t.Errorf("replaced policy's fragmentation %v, a fresh one's %v", got, want)
	}
}

func TestSetCapacityAndUsed(t *testing.T) {
	c, err := NewCluster([]NodeSpec{{Name: "a", CPUMilli: 8000, MemoryMiB: 4096, GPUs: gpus("T4", 1)}})
	if err != nil {
		t.Fatal(err)
	}
	changes := 0
	c.OnChange(func(int) { changes++ })
	if err := c.Assign(Placement{Node: 0}, &Request{CPUMilli: 1000, MemoryMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	c.SetCapacity(0, 16000, 8192)
	if cpu, mem := c.FreeCPU(0); cpu != 15000 || mem != 7168 {
		t.Fatalf("free after a larger capacity: %d %d", cpu, mem)
	}
	c.SetUsed(0, 20000, 2048)
	if cpu, mem := c.FreeCPU(0); cpu != 0 || mem != 6144 {
		t.Fatalf("free after SetUsed: %d %d (use is clamped to the capacity)", cpu, mem)
	}
	c.SetUsed(0, 20000, 2048)
	if changes != 3 {
		t.Errorf("%d change notifications, want 3 (none for a no-op)", changes)
	}
	if _, err := NewScheduler(c, Spread{}, 1).Place(&Request{CPUMilli: 1, GPUs: 1, Share: 100}); err == nil {
		t.Error("placed a request on a node without free CPU")
	}
}
