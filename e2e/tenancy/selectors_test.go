package tenancy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// selectorAttack is a pod whose claim has 8 subrequests of 32 selectors, the most a request
// may have: 31 distinct selectors every GPU matches (or, costly, a comprehension the API
// server accepts that costs about 30,000 CEL units per GPU), then one no GPU matches.
func selectorAttack(ns, name string, tag int, costly bool) (*resourceapi.ResourceClaimTemplate, *corev1.Pod) {
	gp := framework.MakeGPUPod(ns, name).Memory("1Gi")
	tmpl := gp.Template()
	var subs []resourceapi.DeviceSubRequest
	for i := range 8 {
		var sels []resourceapi.DeviceSelector
		for j := range 31 {
			x := fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index != %d`, 1000+tag*1000+i*32+j)
			if costly {
				x = comprehension(tag*1000 + i*32 + j)
			}
			sels = append(sels, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: x}})
		}
		sels = append(sels, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.fgpu.dev"].index == 99`}})
		subs = append(subs, resourceapi.DeviceSubRequest{Name: fmt.Sprintf("s%d", i), DeviceClassName: api.DeviceClassShared, Selectors: sels,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse("1Gi")}}})
	}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", FirstAvailable: subs}}
	return tmpl, gp.Pod()
}

// comprehension is true on every GPU, and distinct per tag so that no memo shares it.
func comprehension(tag int) string {
	var xs []string
	for i := range 100 {
		xs = append(xs, fmt.Sprint(i))
	}
	l := "[" + strings.Join(xs, ",") + "]"
	return fmt.Sprintf("%s.all(x, %s.all(y, x != -y - %d))", l, l, tag+1)
}

// Findings 1 and 2 of the third round, as the edit-only tenant: claims with the most
// selectors a request may have, more distinct expressions than any memo holds, every list
// ending in a selector no GPU matches, one of them with costly selectors. None is placed on
// a GPU its selectors exclude, the costly one is told why it is refused, and another
// namespace's ordinary pod still runs. (kube-scheduler evaluates the same selectors for the
// tenant's pods, on its own time: more costly claims slow it, whatever fgpu does; see
// docs/threat-model.md.)
func TestSelectorsNeitherStallNorMislead(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	ns := cluster.Namespace(t, "selectors")
	tenant := cluster.Tenant(t, ns, "attacker")
	victimNS := cluster.Namespace(t, "selectors-victim")

	baseline := time.Now()
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "before").Memory("4Gi")); err != nil {
		t.Fatal(err)
	}
	running(t, victimNS, "before")
	idle := time.Since(baseline)

	var pods []*corev1.Pod
	for i := range 12 {
		costly := i == 0
		tmpl, pod := selectorAttack(ns, fmt.Sprintf("a%d", i), i, costly)
		if _, err := tenant.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("template %s: %v", tmpl.Name, err)
		}
		p, err := tenant.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}

	start := time.Now()
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "during").Memory("4Gi")); err != nil {
		t.Fatal(err)
	}
	running(t, victimNS, "during")
	t.Logf("another namespace's 4Gi pod: created to running in %s on an idle allocator, %s beside the attack", idle.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	for i, p := range pods {
		if i == 0 {
			waitClaimStatus(t, p, podTimeout, "device selectors cost more than the allocator evaluates for one claim")
		} else {
			waitClaimStatus(t, p, podTimeout, "no GPU can take 1Gi now", "device selectors do not match")
		}
		notAllocated(t, p)
	}
	healthy(t, victimNS)
}
