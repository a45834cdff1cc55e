package plugin

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/driverroot"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// A claim's container gets the driver root's libraries, soname links, tools and sockets at the
// paths a CUDA image expects, from the host path under the driver root, read-only.
func TestClaimSpecCarriesTheDriver(t *testing.T) {
	e := newEnv(t)
	local := filepath.Join(filepath.Dir(e.cfg.CDIDir), "driver")
	fr, err := fake.LayOutDriverRoot(local)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.DriverRoot, e.cfg.DriverRootLocal = "/run/nvidia/driver", local
	s := e.state()
	// An MPS share and a whole GPU: each container gets the driver once.
	for _, claim := range []*builders.ClaimBuilder{
		builders.MakeClaim("ns", "share").Memory("10Gi").AllocatedOn(node, "gpu-0"),
		builders.MakeClaim("ns", "whole").AllocatedOn(node, "gpu-1"),
	} {
		c := claim.Obj()
		devs, err := s.Prepare(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range devs {
			ids = append(ids, d.CDIDeviceIDs...)
		}
		cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cfg.CDIDir), cdiapi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := cache.InjectDevices(spec, ids...); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{} // container path -> host path
		for _, lib := range fr.Libraries {
			want["/"+lib] = "/run/nvidia/driver/" + lib
			want[filepath.Join(driverroot.ImageLibDir, filepath.Base(lib))] = "/run/nvidia/driver/" + lib
		}
		for link, lib := range fr.Links {
			want["/"+link] = "/run/nvidia/driver/" + lib
			want[filepath.Join(driverroot.ImageLibDir, filepath.Base(link))] = "/run/nvidia/driver/" + lib
		}
		for _, f := range append(slices.Clone(fr.Binaries), fr.Sockets...) {
			want["/"+f] = "/run/nvidia/driver/" + f
		}
		got := map[string]string{}
		for _, m := range spec.Mounts {
			if !strings.HasPrefix(m.Source, "/run/nvidia/driver/") {
				continue // the MPS share's own mounts
			}
			if _, dup := got[m.Destination]; dup {
				t.Errorf("%s: %s mounted twice", c.Name, m.Destination)
			}
			got[m.Destination] = m.Source
			if !strings.HasSuffix(m.Destination, "/socket") && !slices.Contains(m.Options, "ro") {
				t.Errorf("%s: %s is not read-only: %v", c.Name, m.Destination, m.Options)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d driver mounts, want %d: %v", c.Name, len(got), len(want), got)
		}
		for dst, src := range want {
			if got[dst] != src {
				t.Errorf("%s: %s comes from %q, want %q", c.Name, dst, got[dst], src)
			}
		}
	}
}

func TestStartFailsClearlyWithoutADriver(t *testing.T) {
	e := newEnv(t)
	e.cfg.DriverRoot, e.cfg.DriverRootLocal = "/run/nvidia/driver", t.TempDir()
	_, err := NewState(context.Background(), e.cfg, e.backend(), nil)
	if err == nil || !strings.Contains(err.Error(), "/run/nvidia/driver") || !strings.Contains(err.Error(), "driverRoot") {
		t.Fatalf("error %v, want one naming the driver root and the chart value", err)
	}
}
