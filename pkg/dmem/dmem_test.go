package dmem

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	uid    = "0a1b2c3d-1111-2222-3333-444455556666"
	region = "nvidia/0000:3b:00.0/vidmem"
)

// fakeRoot lays out a cgroup v2 root with the dmem controller and the given cgroups (each with
// empty interface files, as the kernel shows them).
func fakeRoot(t *testing.T, cgroups ...string) Root {
	t.Helper()
	root := t.TempDir()
	write(t, root, "cgroup.controllers", "cpuset cpu io memory pids dmem\n")
	write(t, root, "cgroup.subtree_control", "cpu memory pids\n")
	write(t, root, "dmem.capacity", region+" 150754820096\nnvidia/0000:4c:00.0/vidmem 150754820096\n")
	for _, cg := range cgroups {
		dir := ""
		for _, part := range strings.Split(cg, "/") {
			dir = filepath.Join(dir, part)
			write(t, root, filepath.Join(dir, "cgroup.subtree_control"), "")
			write(t, root, filepath.Join(dir, "dmem.max"), "")
		}
	}
	return Root{Path: root}
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, root Root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root.Path, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCapacity(t *testing.T) {
	r := fakeRoot(t)
	c, err := r.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	if c[Region("0000:3B:00.0")] != 150754820096 || len(c) != 2 {
		t.Errorf("capacity %v", c)
	}
}

func TestCapacityAbsent(t *testing.T) {
	v1 := t.TempDir() // cgroup v1: a tmpfs of per-controller mounts, no cgroup.controllers
	if err := os.Mkdir(filepath.Join(v1, "memory"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := (Root{Path: v1}).Capacity(); err == nil || !strings.Contains(err.Error(), "not a cgroup v2 mount") {
		t.Errorf("cgroup v1: %v", err)
	}
	noDmem := fakeRoot(t)
	write(t, noDmem.Path, "cgroup.controllers", "cpu memory pids\n")
	if _, err := noDmem.Capacity(); err == nil || !strings.Contains(err.Error(), "no dmem cgroup controller") {
		t.Errorf("older kernel: %v", err)
	}
}

func TestPodCgroupNaming(t *testing.T) {
	us := strings.ReplaceAll(uid, "-", "_")
	for _, cg := range []string{
		"kubepods/pod" + uid,
		"kubepods/burstable/pod" + uid,
		"kubepods/besteffort/pod" + uid,
		"kubepods.slice/kubepods-pod" + us + ".slice",
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us + ".slice",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice",
	} {
		r := fakeRoot(t, cg)
		got, err := r.PodCgroup(uid)
		if err != nil || got != cg {
			t.Errorf("%s: found %q, %v", cg, got, err)
		}
	}
	if _, err := fakeRoot(t, "kubepods/burstable").PodCgroup(uid); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("no pod cgroup yet: %v", err)
	}
}

func TestSetMaxAndClear(t *testing.T) {
	cg := "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	r := fakeRoot(t, cg)
	if err := r.SetMax(cg, region, 10<<30); err != nil {
		t.Fatal(err)
	}
	if got := read(t, r, filepath.Join(cg, "dmem.max")); got != region+" 10737418240\n" {
		t.Errorf("dmem.max %q", got)
	}
	// The controller is enabled from the root down to the pod's parent, once.
	for _, dir := range []string{".", "kubepods.slice", "kubepods.slice/kubepods-burstable.slice"} {
		got := read(t, r, filepath.Join(dir, "cgroup.subtree_control"))
		if !strings.Contains(got, "+dmem") {
			t.Errorf("%s/cgroup.subtree_control %q", dir, got)
		}
	}
	if got := read(t, r, filepath.Join(cg, "cgroup.subtree_control")); got != "" {
		t.Errorf("the pod's own subtree_control was written: %q", got)
	}
	if err := r.SetMax(cg, region, 0); err != nil {
		t.Fatal(err)
	}
	if got := read(t, r, filepath.Join(cg, "dmem.max")); got != region+" max\n" {
		t.Errorf("cleared dmem.max %q", got)
	}
	if n, err := r.Max(cg, region); err != nil || n != -1 {
		t.Errorf("Max after clear: %d, %v", n, err)
	}
}

func TestSetMaxGoneCgroup(t *testing.T) {
	r := fakeRoot(t, "kubepods/burstable")
	if err := r.SetMax("kubepods/burstable/pod"+uid, region, 1<<30); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("pod cgroup gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.Path, "kubepods/burstable/pod"+uid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cgroup file was created: %v", err)
	}
}

func TestRefusesPathsOutsideTheRoot(t *testing.T) {
	r := fakeRoot(t, "kubepods/burstable")
	outside := t.TempDir()
	write(t, outside, "dmem.max", "")
	write(t, outside, "cgroup.subtree_control", "")
	if err := os.Symlink(outside, filepath.Join(r.Path, "kubepods/burstable/pod"+uid)); err != nil {
		t.Fatal(err)
	}
	for _, cg := range []string{"../" + filepath.Base(outside), outside, "kubepods/../../x", "kubepods/burstable/pod" + uid} {
		if err := r.SetMax(cg, region, 1<<30); err == nil {
			t.Errorf("SetMax(%q) wrote", cg)
		}
	}
	if _, err := r.PodCgroup(uid); err == nil {
		t.Error("a symbolic link was taken for the pod's cgroup")
	}
	for _, bad := range []string{"../../etc", "0a1b2c3d-1111-2222-3333-444455556666/../x", ""} {
		if _, err := r.PodCgroup(bad); err == nil || errors.Is(err, ErrNoCgroup) {
			t.Errorf("PodCgroup(%q): %v", bad, err)
		}
	}
	if err := r.SetMax("kubepods/burstable", "nvidia/x/vidmem 1\nother", 1); err == nil {
		t.Error("a region with a newline was written")
	}
	if got := read(t, Root{Path: outside}, "dmem.max"); got != "" {
		t.Errorf("wrote outside the root: %q", got)
	}
}
