// Package dmem reads and writes the cgroup v2 device-memory ("dmem") controller's files, through
// which NVIDIA drivers r615+ (MPS v3 memory partitioning) cap the GPU memory of every process in
// a cgroup together. It writes nothing but the dmem files and cgroup.subtree_control of cgroups
// that already exist under its root, and no path a caller passes leaves that root.
package dmem

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrNoCgroup says that a pod's cgroup is not (yet) under the root.
var ErrNoCgroup = errors.New("no such cgroup")

// Root is a cgroup v2 mount as the plugin sees it, e.g. /sys/fs/cgroup.
type Root struct{ Path string }

// Region is the dmem region of an NVIDIA GPU by its PCI bus id in sysfs form ("0000:3b:00.0").
func Region(pciBusID string) string { return "nvidia/" + strings.ToLower(pciBusID) + "/vidmem" }

// Capacity lists the dmem regions the kernel offers (dmem.capacity: "<region> <bytes>" per line).
// It fails where the root is not cgroup v2 (no cgroup.controllers) or has no dmem controller.
func (r Root) Capacity() (map[string]int64, error) {
	ctrl, err := os.ReadFile(filepath.Join(r.Path, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("%s is not a cgroup v2 mount: %w", r.Path, err)
	}
	if !slices.Contains(strings.Fields(string(ctrl)), "dmem") {
		return nil, fmt.Errorf("the kernel has no dmem cgroup controller (%s lists %q)", filepath.Join(r.Path, "cgroup.controllers"), strings.TrimSpace(string(ctrl)))
	}
	f, err := os.Open(filepath.Join(r.Path, "dmem.capacity"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		n, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		out[fields[0]] = n
	}
	return out, sc.Err()
}

// podUID is the form the API server gives pod UIDs; anything else never names a path.
var podUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// PodCgroup finds the cgroup the kubelet made for a pod, relative to the root: the cgroupfs
// driver's kubepods[/burstable|/besteffort]/pod<uid>, or the systemd driver's
// kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with _>.slice (kubelet
// --cgroup-root "/", the default). ErrNoCgroup where none exists yet.
func (r Root) PodCgroup(uid string) (string, error) {
	if !podUID.MatchString(uid) {
		return "", fmt.Errorf("refusing pod UID %q: not a UUID", uid)
	}
	us := strings.ReplaceAll(uid, "-", "_")
	candidates := []string{
		"kubepods/pod" + uid,
		"kubepods/burstable/pod" + uid,
		"kubepods/besteffort/pod" + uid,
		"kubepods.slice/kubepods-pod" + us + ".slice",
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us + ".slice",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice",
	}
	for _, c := range candidates {
		p, err := r.within(c)
		if err != nil {
			return "", err
		}
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			return c, nil
		}
	}
	return "", fmt.Errorf("pod %s: %w under %s", uid, ErrNoCgroup, r.Path)
}

// SetMax sets the hard limit (dmem.max) of a region in a cgroup; bytes ≤ 0 removes it ("max").
// It first enables the dmem controller down to the cgroup (cgroup.subtree_control of each
// ancestor), without which the cgroup has no dmem.max.
func (r Root) SetMax(cgroup, region string, bytes int64) error {
	if strings.ContainsAny(region, " \n") {
		return fmt.Errorf("invalid dmem region %q", region)
	}
	if err := r.enable(cgroup); err != nil {
		return err
	}
	value := "max"
	if bytes > 0 {
		value = strconv.FormatInt(bytes, 10)
	}
	return r.write(filepath.Join(cgroup, "dmem.max"), region+" "+value)
}

// Max reads a region's hard limit in a cgroup: -1 for none ("max" or not listed).
func (r Root) Max(cgroup, region string) (int64, error) {
	p, err := r.within(filepath.Join(cgroup, "dmem.max"))
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == region && f[1] != "max" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return -1, nil
}

// enable writes "+dmem" to cgroup.subtree_control of the root and every ancestor of cgroup
// that does not list it yet. These are kubelet-made cgroups without processes of their own,
// where the kernel allows it.
func (r Root) enable(cgroup string) error {
	if _, err := r.within(cgroup); err != nil {
		return err
	}
	dir := ""
	for _, part := range strings.Split(filepath.Clean(cgroup), string(filepath.Separator)) {
		ctl := filepath.Join(dir, "cgroup.subtree_control")
		p, err := r.within(ctl)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", filepath.Join(r.Path, dir), ErrNoCgroup)
		}
		if err != nil {
			return err
		}
		if !slices.Contains(strings.Fields(string(b)), "dmem") {
			if err := r.write(ctl, "+dmem"); err != nil {
				return fmt.Errorf("enable the dmem controller below %s: %w", filepath.Join(r.Path, dir), err)
			}
		}
		dir = filepath.Join(dir, part)
	}
	return nil
}

// write writes one line to an existing cgroup file (never creates one).
func (r Root) write(rel, line string) error {
	p, err := r.within(rel)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", p, ErrNoCgroup)
	}
	if err != nil {
		return err
	}
	_, werr := f.WriteString(line + "\n")
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		return fmt.Errorf("write %q to %s: %w", line, p, werr)
	}
	return nil
}

// within joins rel to the root and refuses a path that leaves it, lexically or through a
// symbolic link of an existing part (cgroupfs has none).
func (r Root) within(rel string) (string, error) {
	if r.Path == "" {
		return "", errors.New("no cgroup root")
	}
	if !filepath.IsLocal(rel) {
		return "", fmt.Errorf("refusing %q: outside the cgroup root %s", rel, r.Path)
	}
	p := filepath.Join(r.Path, rel)
	dir := r.Path
	for _, part := range strings.Split(filepath.Clean(rel), string(filepath.Separator)) {
		if part == "." || part == "" {
			continue
		}
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return "", fmt.Errorf("refusing %s: a symbolic link under the cgroup root %s", dir, r.Path)
		}
	}
	return p, nil
}
