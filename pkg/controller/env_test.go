package controller

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	fgpufake "github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned/fake"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
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
	// claimsHandled and podsHandled are what the controller's claim and pod handlers have
	// finished with (watchHandlers).
	claimsHandled, podsHandled *handledObjects
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
	e.watchHandlers()
	e.rec = record.NewFakeRecorder(10000)
	// The parts New built record their events themselves, with the recorder it gave them.
	e.c.recorder, e.c.status.recorder, e.c.gone.recorder, e.c.policyStatus.recorder = e.rec, e.rec, e.rec, e.rec
	e.c.sizing.recorder, e.c.idle.recorder, e.c.reclaim.recorder = e.rec, e.rec, e.rec
	if !e.c.WaitForCacheSync(ctx) {
		t.Fatal("caches did not sync")
	}
	e.settle()
	return e
}

// settle waits until the informers show what the fake API server holds, and the
// controller's claim and pod handlers have finished with what they show.
func (e *env) settle() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cl, _ := e.client.ResourceV1().ResourceClaims("").List(e.ctx, metav1.ListOptions{})
		cached, _ := e.c.claims.List(everything())
		pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
		cachedPods, _ := e.c.pods.List(everything())
		if sameClaims(cl.Items, cached) && len(pods.Items) == len(cachedPods) &&
			handledAll(e.claimsHandled, cached) && handledAll(e.podsHandled, cachedPods) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	e.t.Fatal("informers did not catch up")
}

// watchHandlers gives the controller informers like those New made (New's are never
// started) whose claim and pod handlers note what they have finished with, for settle. An
// informer updates its cache before it tells its handlers, and runs each handler on a
// goroutine of its own: neither the cache nor another handler registered beside the
// controller's says that the controller's handler has run. Every part of the controller
// that reads the caches is given the new ones; readsListers fails the test where one is not.
func (e *env) watchHandlers() {
	e.t.Helper()
	old := e.c.listers
	e.claimsHandled, e.podsHandled = newHandledObjects(), newHandledObjects()
	h := e.c.handlers()
	h.claim, h.pod = e.claimsHandled.wrap(h.claim), e.podsHandled.wrap(h.pod)
	e.c.informers = newInformerSet(e.client, e.fgpu, h, e.c.cfg.Namespace)
	e.c.listers = e.c.informers.listers
	e.c.sizing.listers, e.c.idle.listers, e.c.gone.listers, e.c.reclaim.listers = e.c.listers, e.c.listers, e.c.listers, e.c.listers
	e.c.policyStatus.policies = e.c.policies
	e.c.decider.nodes = e.c.nodes
	if path := readsListers(reflect.ValueOf(e.c), listerPointers(old), "Controller", map[uintptr]bool{}); path != "" {
		e.t.Fatalf("%s still reads the caches of informers that never start: give it the env's in watchHandlers", path)
	}
}

// listerPointers are the listers' own pointers.
func listerPointers(l listers) map[uintptr]bool {
	out := map[uintptr]bool{}
	v := reflect.ValueOf(l)
	for i := range v.NumField() {
		if f := v.Field(i); !f.IsNil() && f.Elem().Kind() == reflect.Pointer {
			out[f.Elem().Pointer()] = true
		}
	}
	return out
}

// readsListers is the path to a field, in v or in what it points to of this package's
// types, that holds one of the listers old; "" if none does.
func readsListers(v reflect.Value, old map[uintptr]bool, path string, seen map[uintptr]bool) string {
	switch v.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return ""
		}
		if v.Elem().Kind() == reflect.Pointer && old[v.Elem().Pointer()] {
			return path
		}
		return readsListers(v.Elem(), old, path, seen)
	case reflect.Pointer:
		if v.IsNil() || seen[v.Pointer()] || v.Elem().Type().PkgPath() != reflect.TypeFor[env]().PkgPath() {
			return ""
		}
		seen[v.Pointer()] = true
		return readsListers(v.Elem(), old, path, seen)
	case reflect.Struct:
		if v.Type().PkgPath() != reflect.TypeFor[env]().PkgPath() {
			return ""
		}
		for i := range v.NumField() {
			if p := readsListers(v.Field(i), old, path+"."+v.Type().Field(i).Name, seen); p != "" {
				return p
			}
		}
	}
	return ""
}

// handledObjects is, per object (namespace/name), the object an event handler last
// finished with; a deleted one is absent once the handler has finished with its deletion.
type handledObjects struct {
	mu   sync.Mutex
	objs map[string]any
}

func newHandledObjects() *handledObjects { return &handledObjects{objs: map[string]any{}} }

// wrap is h, recording each object once h has returned from its event.
func (ho *handledObjects) wrap(h cache.ResourceEventHandler) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			h.OnAdd(obj, initial)
			ho.record(obj, false)
		},
		UpdateFunc: func(old, cur any) {
			h.OnUpdate(old, cur)
			ho.record(cur, false)
		},
		DeleteFunc: func(obj any) {
			h.OnDelete(obj)
			ho.record(obj, true)
		},
	}
}

func (ho *handledObjects) record(obj any, deleted bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if deleted {
		delete(ho.objs, key)
	} else {
		ho.objs[key] = obj
	}
}

// handledAll says whether the handler has finished with each object of cached, as the
// cache holds it now (the cache hands its handlers the very object it stores), and with the
// deletion of every other.
func handledAll[T metav1.Object](ho *handledObjects, cached []T) bool {
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if len(ho.objs) != len(cached) {
		return false
	}
	for _, o := range cached {
		if ho.objs[cache.MetaObjectToName(o).String()] != any(o) {
			return false
		}
	}
	return true
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
		if err := e.c.policyStatus.sync(e.ctx, p.Name); err != nil {
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

// awaitEvents is events for something an informer's event handler records: settle waits
// for the claim and pod handlers only, and another handler may run just after it returns.
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

// charged is what namespace ns's claims count against its quota in the model.
func (e *env) charged(ns string) (u model.Usage) {
	e.c.model.Update(func(tx *model.Tx) { u = tx.Charged(ns) })
	return u
}

// modelClaims counts the claims the model holds.
func modelClaims(m *model.Model) int {
	n := 0
	for _, u := range m.ByNamespace() {
		n += u.Claims
	}
	return n
}
