package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// podCgroups are the cgroups of the usage check's tenants, named as the kubelet's cgroupfs
// driver names a pod's (kubepods/besteffort/pod<uid>/<container>), under a cgroup of the
// check's own: the meter reads the pod's UID from /proc/<pid>/cgroup as on a node.
type podCgroups struct {
	base string
	made []string
}

// podUIDRE is the plugin's: a pod's UID in a cgroup path, cgroupfs or systemd form.
var podUIDRE = regexp.MustCompile(`pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})`)

// ownPodUID is the pod whose cgroup this process is in, if any (the check run in a pod).
func ownPodUID() string {
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	if m := podUIDRE.FindSubmatch(raw); m != nil {
		return strings.ReplaceAll(strings.ToLower(string(m[1])), "_", "-")
	}
	return ""
}

// newPodCgroups makes the check's cgroup, or says why processes are mapped without one.
func newPodCgroups(root string) (*podCgroups, string) {
	const byShare = "the meter picks each process's claim by the FGPU_SHARE_ID its container received"
	if uid := ownPodUID(); uid != "" {
		return nil, fmt.Sprintf("this check runs in pod %s's cgroup, so its tenants do too: both claims are that pod's, and %s", uid, byShare)
	}
	var why []string
	for _, h := range hierarchies() {
		base := filepath.Join(h, "fgpu-usagecheck-"+filepath.Base(root))
		if err := os.Mkdir(base, 0o755); err != nil {
			why = append(why, err.Error())
			continue
		}
		cg := &podCgroups{base: base, made: []string{base}}
		for _, d := range []string{"kubepods", "besteffort"} {
			cg.base = filepath.Join(cg.base, d)
			if err := os.Mkdir(cg.base, 0o755); err != nil {
				cg.remove()
				return nil, fmt.Sprintf("no pod cgroup could be made (%v): processes in no pod's cgroup, %s", err, byShare)
			}
			cg.made = append(cg.made, cg.base)
		}
		return cg, "each tenant in a cgroup named like its pod's (" + filepath.Join(cg.base, "pod<uid>/<container>") + "), as the kubelet makes them; the meter picks the claim by the pod"
	}
	return nil, fmt.Sprintf("no pod cgroup could be made (%s): processes in no pod's cgroup, %s", strings.Join(why, "; "), byShare)
}

// hierarchies are where a cgroup can be made: the unified hierarchy, or (cgroup v1) one that
// needs no settings before it takes a process.
func hierarchies() []string {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []string{"/sys/fs/cgroup"}
	}
	var out []string
	for _, h := range []string{"pids", "cpu,cpuacct", "cpu", "memory", "systemd"} {
		if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", h)); err == nil && fi.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", h))
		}
	}
	return out
}

// create makes the cgroup of a pod's container and returns its cgroup.procs.
func (c *podCgroups) create(podUID string) (string, error) {
	pod := filepath.Join(c.base, "pod"+podUID)
	ctr := filepath.Join(pod, "tenant")
	for _, d := range []string{pod, ctr} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", fmt.Errorf("pod cgroup: %w", err)
		}
		c.made = append(c.made, d)
	}
	return filepath.Join(ctr, "cgroup.procs"), nil
}

// remove removes the cgroups, innermost first, once their processes are gone.
func (c *podCgroups) remove() {
	for i := len(c.made) - 1; i >= 0; i-- {
		for try := 0; try < 50; try++ {
			err := unix.Rmdir(c.made[i])
			if err == nil || os.IsNotExist(err) {
				break
			}
			if try == 49 {
				fmt.Printf("FAIL: cgroup %s is left: %v\n", c.made[i], err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
