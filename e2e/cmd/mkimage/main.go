// Command mkimage builds a single-layer container image from files on disk and writes it as a
// docker-archive tarball, so the local test cluster (and kind) can run the project's binaries
// without any registry: `ctr -n k8s.io images import` or `kind load image-archive` take the file.
//
//	go run ./e2e/cmd/mkimage --tag fgpu.dev/fgpu:dev --out _output/images/fgpu.tar \
//	    --file _output/images/bin/fgpu-allocator:/usr/bin/fgpu-allocator \
//	    --entrypoint /usr/bin/fgpu-allocator
//
// The image always carries /tmp (1777), /etc/passwd, /etc/group and /etc/nsswitch.conf, so
// programs that look up users or write temporary files work. Timestamps are fixed, so the same
// inputs give the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// listFlag collects a flag given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// epoch is the modification time of every entry and the image's creation time.
var epoch = time.Unix(0, 0).UTC()

func main() {
	var (
		tags, files, dirs, envs, entrypoint, cmd listFlag
		out, workdir, user                       string
	)
	flag.Var(&tags, "tag", "image reference to record in the archive, e.g. fgpu.dev/fgpu:dev (repeatable, at least one)")
	flag.StringVar(&out, "out", "", "docker-archive tarball to write (required)")
	flag.Var(&files, "file", "SRC:DST[:MODE] copy host file SRC to absolute path DST in the image; MODE is octal, default SRC's permissions (repeatable)")
	flag.Var(&dirs, "dir", "DST[:MODE] create an empty directory in the image (repeatable)")
	flag.Var(&envs, "env", "KEY=VALUE environment variable of the image (repeatable)")
	flag.Var(&entrypoint, "entrypoint", "one argv element of the entrypoint; repeat for more (\"--entrypoint /usr/bin/x --entrypoint -v\")")
	flag.Var(&cmd, "cmd", "one argv element of the default command; repeat for more")
	flag.StringVar(&workdir, "workdir", "/", "working directory of the image")
	flag.StringVar(&user, "user", "", "user the image runs as (default root)")
	flag.Parse()

	if err := run(tags, out, files, dirs, envs, entrypoint, cmd, workdir, user); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(tags []string, out string, files, dirs, envs, entrypoint, cmd []string, workdir, user string) error {
	if len(tags) == 0 || out == "" {
		return errors.New("--tag and --out are required")
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (use --file SRC:DST)", flag.Args())
	}
	refs := make(map[name.Tag]v1.Image, len(tags))
	var refList []name.Tag
	for _, t := range tags {
		ref, err := name.NewTag(t, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("tag %q: %w (give it in full, e.g. fgpu.dev/fgpu:dev)", t, err)
		}
		refList = append(refList, ref)
	}

	layerTar, err := buildLayer(files, dirs)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture = runtime.GOARCH
	cf.OS = "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Cmd = cmd
	cf.Config.WorkingDir = workdir
	cf.Config.User = user
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, envs...)
	for _, e := range envs {
		if !strings.Contains(e, "=") {
			return fmt.Errorf("--env %q: want KEY=VALUE", e)
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for _, r := range refList {
		refs[r] = img
	}

	if dir := path.Dir(out); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := tarball.MultiRefWrite(toRefs(refs), f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", out, strings.Join(tags, ","), digest)
	return nil
}

func toRefs(m map[name.Tag]v1.Image) map[name.Reference]v1.Image {
	r := make(map[name.Reference]v1.Image, len(m))
	for k, v := range m {
		r[k] = v
	}
	return r
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

// buildLayer returns an uncompressed tar with the base files, the requested directories and files,
// and every parent directory, sorted by path.
func buildLayer(files, dirs []string) ([]byte, error) {
	entries := map[string]*entry{}
	addDir := func(p string, mode int64) {
		for d := p; d != "/" && d != "."; d = path.Dir(d) {
			key := strings.TrimPrefix(d, "/")
			if e, ok := entries[key]; ok {
				if d == p && mode != 0 {
					e.hdr.Mode = mode
				}
				continue
			}
			m := int64(0o755)
			if d == p && mode != 0 {
				m = mode
			}
			entries[key] = &entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: key + "/", Mode: m}}
		}
	}
	addFile := func(p string, mode int64, data []byte) {
		addDir(path.Dir(p), 0)
		key := strings.TrimPrefix(p, "/")
		entries[key] = &entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: key, Mode: mode, Size: int64(len(data))}, data: data}
	}

	addDir("/tmp", 0o1777)
	addDir("/root", 0o700)
	addFile("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"))
	addFile("/etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
	addFile("/etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n"))

	for _, d := range dirs {
		p, mode, err := splitMode(d)
		if err != nil {
			return nil, fmt.Errorf("--dir %q: %w", d, err)
		}
		addDir(p, mode)
	}
	for _, f := range files {
		parts := strings.SplitN(f, ":", 3)
		if len(parts) < 2 || parts[0] == "" || !path.IsAbs(parts[1]) {
			return nil, fmt.Errorf("--file %q: want SRC:/ABS/DST[:MODE]", f)
		}
		data, err := os.ReadFile(parts[0])
		if err != nil {
			return nil, fmt.Errorf("--file %q: %w", f, err)
		}
		st, err := os.Stat(parts[0])
		if err != nil {
			return nil, err
		}
		mode := int64(st.Mode().Perm())
		if len(parts) == 3 {
			if _, err := fmt.Sscanf(parts[2], "%o", &mode); err != nil {
				return nil, fmt.Errorf("--file %q: mode: %w", f, err)
			}
		}
		addFile(path.Clean(parts[1]), mode, data)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, k := range slices.Sorted(maps.Keys(entries)) {
		e := entries[k]
		e.hdr.ModTime = epoch
		e.hdr.Uname, e.hdr.Gname = "root", "root"
		e.hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func splitMode(s string) (string, int64, error) {
	p, m, hasMode := strings.Cut(s, ":")
	if !path.IsAbs(p) {
		return "", 0, errors.New("path must be absolute")
	}
	var mode int64
	if hasMode {
		if _, err := fmt.Sscanf(m, "%o", &mode); err != nil {
			return "", 0, err
		}
	}
	return path.Clean(p), mode, nil
}
