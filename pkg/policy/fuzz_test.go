package policy

import (
	"encoding/json"
	"reflect"
	"testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// FuzzSharingPolicy decodes a SharingPolicy as the allocator's client does and resolves it
// for a claim: an invalid policy never applies, a valid one keeps its verdict across a
// re-encode, a policy that pod labels alone select grants no privilege, and a valid policy
// without selectors applies to every claim with its quota.
func FuzzSharingPolicy(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte, nsKey, nsValue, podKey, podValue string) {
		var p api.SharingPolicy
		if err := json.Unmarshal(raw, &p); err != nil {
			return
		}
		p.DeletionTimestamp = nil
		verr := p.Spec.Validate()
		again, err := json.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		var q api.SharingPolicy
		if err := json.Unmarshal(again, &q); err != nil {
			t.Fatalf("a decoded policy does not decode after a re-encode: %v\n%s", err, again)
		}
		if qerr := q.Spec.Validate(); (qerr == nil) != (verr == nil) {
			t.Fatalf("re-encoding changed the verdict: %v, then %v\n%s", verr, qerr, again)
		}
		p.Name = "fuzzed"
		ns, pod := map[string]string{nsKey: nsValue}, map[string]string{podKey: podValue}
		got := Resolve([]*api.SharingPolicy{&p}, ns, pod)
		if verr != nil {
			if got.Name == p.Name {
				t.Fatalf("an invalid policy (%v) applies", verr)
			}
			return
		}
		if priv := p.Spec.UnboundPrivileges(); len(priv) > 0 && got.Name == p.Name {
			t.Fatalf("a policy that pod labels alone select grants %v", priv)
		}
		if p.Spec.NamespaceSelector != nil || p.Spec.PodSelector != nil {
			return
		}
		want := FromSpec(p.Name, &p.Spec)
		want.Quota = NamespaceQuota([]*api.SharingPolicy{&p}, ns)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("a valid policy without selectors resolved to %+v, want %+v", got, want)
		}
		if q := got.Quota; (q.Memory != nil && q.Memory.Sign() < 0) || (q.Compute != nil && *q.Compute < 0) {
			t.Fatalf("a negative quota applies: %+v", got)
		}
	})
}
