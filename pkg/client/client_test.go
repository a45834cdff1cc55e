// Package client_test checks the generated clientset, listers and informers (hack/update-codegen.sh)
// against what the allocator needs from them.
package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned/fake"
	"github.com/fgpu-dev/fgpu/pkg/client/informers/externalversions"
	fgpuinformers "github.com/fgpu-dev/fgpu/pkg/client/informers/externalversions/fgpu.dev/v1alpha1"
)

func policy(name string, priority int32) *api.SharingPolicy {
	return &api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: api.SharingPolicySpec{Priority: priority, Isolation: api.IsolationNone, MaxTenantsPerGPU: ptr.To[int32](4)}}
}

// The typed informer delivers policies, those there at start and those created or deleted
// later, to typed handlers (no type assertions) and to its lister.
func TestInformerDeliversSharingPolicies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := fake.NewSimpleClientset(policy("a", 10))
	// The fake tracker does not replay what was created before a watch began: change
	// policies once the informer's watch is registered.
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("sharingpolicies", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	factory := externalversions.NewSharedInformerFactory(client, 0)
	inf := factory.Fgpu().V1alpha1().SharingPolicies()
	added, deleted := make(chan *api.SharingPolicy, 2), make(chan string, 1)
	if _, err := inf.TypedInformer().AddTypedEventHandler(fgpuinformers.SharingPolicyHandlerFuncs{
		AddFunc:    func(p *api.SharingPolicy) { added <- p },
		DeleteFunc: func(d fgpuinformers.DeletedSharingPolicy) { deleted <- d.GetName() },
	}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}
	select {
	case <-watching:
	case <-ctx.Done():
		t.Fatal("the informer never watched")
	}
	policies := client.FgpuV1alpha1().SharingPolicies()
	if _, err := policies.Create(ctx, policy("b", 20), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int32{}
	for len(seen) < 2 {
		select {
		case p := <-added:
			seen[p.Name] = p.Spec.Priority
		case <-ctx.Done():
			t.Fatalf("handler saw only %v", seen)
		}
	}
	if seen["a"] != 10 || seen["b"] != 20 {
		t.Fatalf("handler saw %v, want a:10 and b:20", seen)
	}
	p, err := inf.Lister().Get("b")
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Isolation != api.IsolationNone || p.Spec.MaxTenantsPerGPU == nil || *p.Spec.MaxTenantsPerGPU != 4 {
		t.Fatalf("lister returned %+v", p.Spec)
	}
	if err := policies.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-deleted:
		if name != "a" {
			t.Fatalf("deleted %q, want a", name)
		}
	case <-ctx.Done():
		t.Fatal("the deletion was not delivered")
	}
}

// A policy that does not decode is an error the informer reports, not an object quietly
// dropped (the dynamic informer's converted copy used to lose it).
func TestUndecodablePolicySurfaces(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/fgpu.dev/v1alpha1/sharingpolicies" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"fgpu.dev/v1alpha1","kind":"SharingPolicyList","metadata":{"resourceVersion":"1"},
			"items":[{"metadata":{"name":"bad"},"spec":{"priority":"high"}}]}`))
	}))
	defer srv.Close()
	client, err := versioned.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inf := externalversions.NewSharedInformerFactory(client, 0).Fgpu().V1alpha1().SharingPolicies().Informer()
	errs := make(chan error, 1)
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		select {
		case errs <- err:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	go inf.RunWithContext(ctx)
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "priority") {
			t.Fatalf("error %q does not name the bad field", err)
		}
	case <-ctx.Done():
		t.Fatal("the undecodable policy was not reported")
	}
	if inf.HasSynced() {
		t.Fatal("the informer synced without the policy")
	}
}
