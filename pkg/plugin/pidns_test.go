package plugin

import (
	"os"
	"path/filepath"
	"testing"
)

func TestInNodePIDNamespace(t *testing.T) {
	for _, c := range []struct {
		name                    string
		pidNS, comm, own, first string
		want                    bool
	}{
		{"the kernel's initial namespace", initPIDNamespace, "systemd", "mnt:[1]", "mnt:[2]", true},
		{"hostPID on a node in a container", "pid:[7]", "systemd", "mnt:[1]", "mnt:[2]", true},
		{"a pod's own namespace", "pid:[7]", "fgpu-kubelet-plugin", "mnt:[1]", "mnt:[1]", false},
		{"a pod sharing its process namespace", "pid:[7]", "pause", "mnt:[1]", "mnt:[3]", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			proc := t.TempDir()
			for _, l := range []struct{ path, target string }{
				{"self/ns/pid", c.pidNS}, {"self/ns/mnt", c.own}, {"1/ns/mnt", c.first},
			} {
				if err := os.MkdirAll(filepath.Join(proc, filepath.Dir(l.path)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(l.target, filepath.Join(proc, l.path)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(proc, "1", "comm"), []byte(c.comm+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := InNodePIDNamespace(proc)
			if err != nil || got != c.want {
				t.Fatalf("InNodePIDNamespace = %v, %v; want %v", got, err, c.want)
			}
		})
	}
	if _, err := InNodePIDNamespace(t.TempDir()); err == nil {
		t.Fatal("no error without a /proc to read")
	}
}
