package v1alpha1

import (
	"bytes"
	"encoding/json"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// update rewrites the golden files: go test ./api/fgpu.dev/v1alpha1 -run TestWireGolden -update
var update = flag.Bool("update", false, "rewrite testdata/*.golden.json from the current wire contract")

// wireNames is every name fgpu puts on the wire, by its Go name. Running clusters, the chart,
// users' claims and workloads depend on these values: a change must be deliberate (-update).
func wireNames() map[string]any {
	return map[string]any{
		"GroupName":          GroupName,
		"SchemeGroupVersion": SchemeGroupVersion.String(),
		"GpuConfigKind":      GpuConfigKind,

		"DriverName":           DriverName,
		"DeviceClassShared":    DeviceClassShared,
		"DeviceClassExclusive": DeviceClassExclusive,
		"CapacityMemory":       CapacityMemory,
		"CapacityCompute":      CapacityCompute,
		"MemoryStep":           MemoryStep,

		"AttributeMemoryCap":             AttributeMemoryCap,
		"AttributeUUID":                  AttributeUUID,
		"AttributeProductName":           AttributeProductName,
		"AttributeArchitecture":          AttributeArchitecture,
		"AttributeIndex":                 AttributeIndex,
		"AttributeMinor":                 AttributeMinor,
		"AttributeComputeMode":           AttributeComputeMode,
		"AttributeCUDAComputeCapability": AttributeCUDAComputeCapability,
		"AttributeDriverVersion":         AttributeDriverVersion,
		"AttributeCUDADriverVersion":     AttributeCUDADriverVersion,
		"AttributePCIeRoot":              AttributePCIeRoot,
		"AttributeNUMANodeStandard":      AttributeNUMANodeStandard,
		"AttributeNVLinkIsland":          AttributeNVLinkIsland,
		"AttributeFabricClique":          AttributeFabricClique,
		"AttributeCPUAffinity":           AttributeCPUAffinity,
		"AttributeNUMANode":              AttributeNUMANode,

		"FenceTaintKey":                  FenceTaintKey,
		"FenceTaintValue":                FenceTaintValue,
		"DeviceConditionPrepared":        DeviceConditionPrepared,
		"PrepareReasonOverCommitted":     PrepareReasonOverCommitted,
		"PrepareReasonDeviceGone":        PrepareReasonDeviceGone,
		"PrepareReasonIsolationConflict": PrepareReasonIsolationConflict,

		"FinalizerAllocator":     FinalizerAllocator,
		"AnnotationStatus":       AnnotationStatus,
		"AnnotationReclaimed":    AnnotationReclaimed,
		"AnnotationSizingRecord": AnnotationSizingRecord,
		"LabelObservedUsage":     LabelObservedUsage,
		"ObservedUsagePrefix":    ObservedUsagePrefix,
		"ObservedUsageKey":       ObservedUsageKey,
		"ForeignTaintKey":        ForeignTaintKey,
		"FaultTaintKey":          FaultTaintKey,
		"DegradedTaintKey":       DegradedTaintKey,
		"FlappingTaintKey":       FlappingTaintKey,
		"LabelMPSDaemon":         LabelMPSDaemon,
		"LabelMPSGPU":            LabelMPSGPU,
		"LabelMPSNode":           LabelMPSNode,
		"CDIVendor":              CDIVendor,
		"CDIClass":               CDIClass,

		"LabelExtendedResource":           LabelExtendedResource,
		"ExtendedResourcePodClaimPrefix":  ExtendedResourcePodClaimPrefix,
		"ExtendedResourceInitClaimPrefix": ExtendedResourceInitClaimPrefix,
		"ExtendedResourceTemplatePrefix":  ExtendedResourceTemplatePrefix,
		"ExtendedResourceMaxGPUs":         ExtendedResourceMaxGPUs,
		"ExtendedResourceRequest":         ExtendedResourceRequest,

		"AnnotationIdleScaleDown":      AnnotationIdleScaleDown,
		"AnnotationScaledDownReplicas": AnnotationScaledDownReplicas,
		"AnnotationScaledDownReserve":  AnnotationScaledDownReserve,

		"EnvGPUUUID":                   EnvGPUUUID,
		"EnvDevice":                    EnvDevice,
		"EnvShareID":                   EnvShareID,
		"EnvSharingMode":               EnvSharingMode,
		"EnvIsolationDomain":           EnvIsolationDomain,
		"EnvMemoryLimitBytes":          EnvMemoryLimitBytes,
		"EnvMemoryLimit":               EnvMemoryLimit,
		"EnvMemoryGuaranteedBytes":     EnvMemoryGuaranteedBytes,
		"EnvMemoryGuaranteed":          EnvMemoryGuaranteed,
		"EnvComputePercent":            EnvComputePercent,
		"EnvMemoryEnforced":            EnvMemoryEnforced,
		"EnvMemoryEnforcement":         EnvMemoryEnforcement,
		"EnvMemoryCap":                 EnvMemoryCap,
		"EnvMPSPipeDirectory":          EnvMPSPipeDirectory,
		"EnvMPSLogDirectory":           EnvMPSLogDirectory,
		"EnvMPSPinnedDeviceMemLimit":   EnvMPSPinnedDeviceMemLimit,
		"EnvMPSActiveThreadPercentage": EnvMPSActiveThreadPercentage,

		"SharingModeMPS":         SharingModeMPS,
		"SharingModeTimeSlicing": SharingModeTimeSlicing,
		"LatencyCritical":        LatencyCritical,
		"LatencyStandard":        LatencyStandard,
		"LatencyBestEffort":      LatencyBestEffort,
		"DefaultIsolationDomain": DefaultIsolationDomain,
	}
}

// wireStructs is a fully populated instance of every struct fgpu marshals into the API
// (claim status data, opaque config, annotations), by golden file.
func wireStructs() map[string]any {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cfg := GpuConfig{
		Mode: SharingModeMPS, MemoryLimit: ptr.To(resource.MustParse("10Gi")), ComputePercent: ptr.To[int32](25),
		IsolationDomain: "team-a",
		Placement: &Placement{Policy: "default", LatencyClass: LatencyCritical, MaxCoTenants: 3, AllowCriticalCoTenants: true,
			MaxTenantsPerGPU: 4, AllowSharedGPU: true, MemoryLimit: ptr.To(resource.MustParse("12Gi"))},
	}
	cfg.APIVersion, cfg.Kind = SchemeGroupVersion.String(), GpuConfigKind
	return map[string]any{
		"devicestatusdata": DeviceStatusData{
			GPUUUID: "GPU-0123", Memory: "10Gi", MemoryLimit: "12Gi", ComputePercent: 25, ThreadPercent: 25,
			Mode: string(SharingModeMPS), IsolationDomain: "team-a/default", MemoryEnforced: true,
			MemoryEnforcement: "mps: caps each MPS client process", MemoryCap: "mps-per-process",
			Usage: &ShareUsage{From: t0, To: t0.Add(5 * time.Minute), Samples: 30,
				MemoryMaxBytes: 6 << 30, MemoryP95Bytes: 5 << 30, MemoryMeanBytes: 4 << 30,
				SMSamples: 28, SMMaxPercent: 90, SMP95Percent: 80, SMMeanPercent: 40},
		},
		"gpuconfig": cfg,
		"sizingrecord": SizingRecord{
			Workload:       SizingWorkload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"},
			Recommendation: SizingRecommendation{MemoryBytes: 8 << 30, ComputePercent: 30, Samples: 180, PeakBytes: 7 << 30, TypicalBytes: 5 << 30},
		},
		"idlereserve": IdleReserve{Memory: resource.MustParse("30Gi"), Compute: 50},
		"observedusage": ObservedUsage{Node: "node-a", Pods: []ObservedPod{{Namespace: "team-a", Name: "web-0", UID: "0c5b7e4e-pod",
			GPUs: []ObservedGPU{{UUID: "GPU-0123", Device: "gpu-0", Usage: ShareUsage{From: t0, To: t0.Add(5 * time.Minute), Samples: 30,
				MemoryMaxBytes: 6 << 30, MemoryP95Bytes: 5 << 30, MemoryMeanBytes: 4 << 30,
				SMSamples: 28, SMMaxPercent: 90, SMP95Percent: 80, SMMeanPercent: 40}}}}}},
	}
}

// TestWireGolden fails when a wire name's value or a wire struct's JSON changes: either is a
// break for running clusters, users' claims or tools that read fgpu's status. After a
// deliberate change, rerun with -update and review the golden diff.
func TestWireGolden(t *testing.T) {
	golden := map[string]any{"names": wireNames()}
	for name, v := range wireStructs() {
		if zero := zeroFields(reflect.ValueOf(v), ""); len(zero) > 0 {
			t.Errorf("%s: fields left empty, so the golden file would not pin their JSON names: %v", name, zero)
		}
		golden[name] = v
	}
	for name, v := range golden {
		got, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, '\n')
		path := filepath.Join("testdata", name+".golden.json")
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to write it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the wire contract changed; if that is meant, rerun with -update and review the diff.\ngot:\n%s\nwant:\n%s", path, got, want)
		}
	}
}

// TestWireNamesComplete keeps wireNames whole: every constant wire.go declares is in it.
func TestWireNamesComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "wire.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	names := wireNames()
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs, ok := s.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for _, id := range vs.Names {
				if _, ok := names[id.Name]; id.IsExported() && !ok {
					t.Errorf("wire.go declares %s, which wireNames (and so the golden file) lacks", id.Name)
				}
			}
		}
	}
}

// zeroFields lists the fields of v, at any depth, that hold their zero value.
func zeroFields(v reflect.Value, path string) []string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return []string{path}
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeFor[time.Time]() || v.Type() == reflect.TypeFor[resource.Quantity]() {
		if v.IsZero() {
			return []string{path}
		}
		return nil
	}
	var out []string
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.IsExported() {
			out = append(out, zeroFields(v.Field(i), path+"."+f.Name)...)
		}
	}
	slices.Sort(out)
	return out
}
