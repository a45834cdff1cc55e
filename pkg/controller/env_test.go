package controller

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	fgpufake "github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned/fake"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// env is a controller over a fake API server, driven by hand.
type env struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	fgpu   *fgpufake.Clientset
	c      *Controller
	rec    *record.FakeRecorder
	clock  *testingclock.FakeClock
	kept   []string
	reg    *prometheus.Registry
}

func newEnv(t *testing.T, policies []*api.SharingPolicy, objs ...runtime.Object) *env {
	t.Helper()
	return newEnvWith(t, nil, policies, objs...)
}

// newEnvWith is newEnv with the controller's configuration changed by configure before the
// informers start.
func newEnvWith(t *testing.T, configure func(*Config), policies []*api.SharingPolicy, objs ...runtime.Object) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	objs = append(objs, builders.MakeClass(api.DeviceClassShared), builders.MakeClass(api.DeviceClassExclusive))
	e := &env{t: t, ctx: ctx, client: fake.NewClientset(objs...), clock: testingclock.NewFakeClock(builders.Created.Add(time.Minute))}
	cfg := DefaultConfig()
	cfg.Workers = 1
	cfg.BindTimeout = time.Minute
	cfg.Now = e.clock.Now
	if configure != nil {
		configure(&cfg)
	}
	e.reg = prometheus.NewRegistry()
	pols := make([]runtime.Object, len(policies))
	for i, p := range policies {
		pols[i] = p
	}
	e.fgpu = fgpufake.NewSimpleClientset(pols...)
	e.c = New(cfg, e.client, e.fgpu, NewMetrics(e.reg))
	e.rec = record.NewFakeRecorder(10000)
	// The sizing loops record their events themselves, with the recorder New gave them.
	e.c.recorder, e.c.sizing.recorder, e.c.idle.recorder = e.rec, e.rec, e.rec
	if !e.c.WaitForCacheSync(ctx) {
		t.Fatal("caches did not sync")
	}
	e.settle()
	return e
}

// settle waits until the informers show what the fake API server holds.
func (e *env) settle() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cl, _ := e.client.ResourceV1().ResourceClaims("").List(e.ctx, metav1.ListOptions{})
		cached, _ := e.c.claims.List(everything())
		pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
		cachedPods, _ := e.c.pods.List(everything())
		if sameClaims(cl.Items, cached) && len(pods.Items) == len(cachedPods) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	e.t.Fatal("informers did not catch up")
}

func sameClaims(a []resourceapi.ResourceClaim, b []*resourceapi.ResourceClaim) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]*resourceapi.ResourceClaim{}
	for _, c := range b {
		m[c.Namespace+"/"+c.Name] = c
	}
	for i := range a {
		c := m[a[i].Namespace+"/"+a[i].Name]
		if c == nil || !reflect.DeepEqual(c.Status, a[i].Status) || !reflect.DeepEqual(c.Finalizers, a[i].Finalizers) ||
			!reflect.DeepEqual(c.Annotations, a[i].Annotations) || !reflect.DeepEqual(c.DeletionTimestamp, a[i].DeletionTimestamp) {
			return false
		}
	}
	return true
}

// run syncs every fgpu claim, oldest first, until nothing changes; then checks the invariant.
func (e *env) run() {
	e.t.Helper()
	e.syncAll()
	e.checkInvariant()
}

// syncAll is run without the invariant check: for states the invariant does not hold in
// (a lost node's claims, allocated to devices no slice publishes any more).
func (e *env) syncAll() {
	e.t.Helper()
	for round := 0; round < 10; round++ {
		e.settle()
		e.syncPolicies()
		before := e.snapshot()
		claims, _ := e.c.claims.List(everything())
		sort.Slice(claims, func(i, j int) bool {
			if !claims[i].CreationTimestamp.Equal(&claims[j].CreationTimestamp) {
				return claims[i].CreationTimestamp.Before(&claims[j].CreationTimestamp)
			}
			return claims[i].Name < claims[j].Name
		})
		for _, cl := range claims {
			if _, err := e.c.Sync(e.ctx, cl.Namespace+"/"+cl.Name); err != nil {
				e.t.Logf("sync %s/%s: %v", cl.Namespace, cl.Name, err)
			}
			e.settle()
		}
		if reflect.DeepEqual(before, e.snapshot()) {
			break
		}
	}
}

// syncPolicies writes the status of every SharingPolicy the allocator sees, as its policy
// worker would.
func (e *env) syncPolicies() {
	e.t.Helper()
	list, _ := e.c.policies.List(everything())
	for _, p := range list {
		if err := e.c.syncPolicy(e.ctx, p.Name); err != nil {
			e.t.Logf("status of SharingPolicy %s: %v", p.Name, err)
		}
	}
}

func (e *env) snapshot() map[string]resourceapi.ResourceClaimStatus {
	cl, _ := e.client.ResourceV1().ResourceClaims("").List(e.ctx, metav1.ListOptions{})
	out := map[string]resourceapi.ResourceClaimStatus{}
	for _, c := range cl.Items {
		out[c.Namespace+"/"+c.Name] = c.Status
	}
	return out
}

func (e *env) checkInvariant() {
	e.t.Helper()
	if err := loadgen.Check(e.ctx, e.client, api.DriverName); err != nil {
		e.t.Fatalf("invariant: %v", err)
	}
}

func (e *env) claim(ns, name string) *resourceapi.ResourceClaim {
	e.t.Helper()
	c, err := e.client.ResourceV1().ResourceClaims(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// placedOn returns "node/gpu" of a claim's first result, or "".
func (e *env) placedOn(ns, name string) string {
	c := e.claim(ns, name)
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
		return ""
	}
	r := c.Status.Allocation.Devices.Results[0]
	return r.Pool + "/" + r.Device
}

func (e *env) create(objs ...runtime.Object) {
	e.t.Helper()
	for _, o := range objs {
		var err error
		switch x := o.(type) {
		case *resourceapi.ResourceClaim:
			_, err = e.client.ResourceV1().ResourceClaims(x.Namespace).Create(e.ctx, x, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = e.client.CoreV1().Pods(x.Namespace).Create(e.ctx, x, metav1.CreateOptions{})
		case *resourceapi.ResourceSlice:
			_, err = e.client.ResourceV1().ResourceSlices().Create(e.ctx, x, metav1.CreateOptions{})
		case *corev1.Node:
			_, err = e.client.CoreV1().Nodes().Create(e.ctx, x, metav1.CreateOptions{})
		default:
			e.t.Fatalf("create: unknown %T", o)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

// events returns the recorded events that contain substr.
func (e *env) events(substr string) []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			e.kept = append(e.kept, ev)
			continue
		default:
		}
		break
	}
	for _, ev := range e.kept {
		if strings.Contains(ev, substr) {
			out = append(out, ev)
		}
	}
	return out
}

// awaitEvents is events for something an informer's event handler records: settle returns
// once the caches hold what the API server holds, and a handler may run just after.
func (e *env) awaitEvents(substr string, n int) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ev := e.events(substr)
		if len(ev) >= n || time.Now().After(deadline) {
			return ev
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func everything() labels.Selector { return labels.Everything() }
