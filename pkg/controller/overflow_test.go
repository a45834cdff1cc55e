package controller

import (
	"math"
	"strings"
	"testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// The API server bounds no capacity request. 8Ei rounded up to the memory step wrapped
// negative, computeFromMemory made that a negative compute, and the namespace's compute
// quota was then charged below zero: six more claims went past it. Such a request is
// refused where it is resolved, and the quota still binds the claims after it.
func TestMemoryBeyondAnyGPUIsRefusedAndLeavesTheQuota(t *testing.T) {
	pols := []*api.SharingPolicy{builders.MakePolicy("q").ComputeFromMemory().QuotaCompute(10).Obj()}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
		builders.MakeClaim("a", "first").Memory("8Gi").Created(0).Obj(), builders.MakePod("a", "first").Claim("first").Obj(),
		builders.MakeClaim("a", "huge").Memory("8Ei").Created(1).Obj(), builders.MakePod("a", "huge").Claim("huge").Obj(),
		builders.MakeClaim("a", "second").Memory("8Gi").Created(2).Obj(), builders.MakePod("a", "second").Claim("second").Obj())
	e.run()
	if e.placedOn("a", "first") == "" {
		t.Fatalf("first not placed: %s", e.claim("a", "first").Annotations[api.AnnotationStatus])
	}
	if got := e.placedOn("a", "huge"); got != "" {
		t.Fatalf("an 8Ei claim was placed on %s", got)
	}
	if st := e.claim("a", "huge").Annotations[api.AnnotationStatus]; !strings.Contains(st, "more than any GPU has") {
		t.Errorf("status of the 8Ei claim %q does not say why", st)
	}
	if got := e.placedOn("a", "second"); got != "" {
		t.Errorf("a second 8Gi claim (10%% compute each) placed on %s under a 10%% compute quota", got)
	}
	if u := e.c.model.ByNamespace()["a"]; u.ChargedComp != 10 {
		t.Errorf("namespace charged %d%% compute, want the first claim's 10%%", u.ChargedComp)
	}
}

func TestAddSat(t *testing.T) {
	for _, tc := range []struct{ a, b, want int64 }{
		{1, 2, 3},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 1, math.MaxInt64, math.MaxInt64},
		{5, -3, 2},
		{math.MinInt64, -1, math.MinInt64},
		{-5, math.MinInt64, math.MinInt64},
		{math.MaxInt64, math.MinInt64, -1},
	} {
		if got := addSat(tc.a, tc.b); got != tc.want {
			t.Errorf("addSat(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
