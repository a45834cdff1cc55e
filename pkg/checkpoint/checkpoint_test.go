package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sample() *Checkpoint {
	cp := New()
	cp.Claims["uid-1"] = &ClaimEntry{Namespace: "ns", Name: "c1", State: PrepareCompleted, Devices: []PreparedDevice{{
		Request: "gpu", Pool: "node", Device: "gpu-0", GPUUUID: "GPU-1", ShareID: "s", MemoryBytes: 10 << 30,
		ComputePercent: 25, MemoryLimitBytes: 10 << 30, ThreadPercent: 25, Mode: "mps", IsolationDomain: "default",
		MPSKey: "default-gpu-1", CDIDeviceIDs: []string{"fgpu.dev/gpu=uid-1-gpu-0"},
	}}}
	cp.Claims["uid-2"] = &ClaimEntry{Namespace: "ns", Name: "c2", State: PrepareStarted}
	cp.Refused = []Refusal{{ClaimUID: "uid-3", Pool: "node", Device: "gpu-0", ShareID: "s3", Reason: "OverCommitted", Message: "refusing to over-commit GPU gpu-0"}}
	return cp
}

func TestRoundTrip(t *testing.T) {
	s := NewStore(filepath.Join(t.TempDir(), "sub", "checkpoint.json"))
	empty, err := s.Load()
	if err != nil || len(empty.Claims) != 0 {
		t.Fatalf("missing file should load empty: %v %v", empty, err)
	}
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Fatalf("round trip changed the checkpoint:\n%+v\n%+v", got, sample())
	}
}

func TestLoadDetectsCorruption(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	s := NewStore(path)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(raw), "gpu-0", "gpu-9", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("edited checkpoint accepted: %v", err)
	}
	if err := os.WriteFile(path, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil {
		t.Fatal("truncated checkpoint accepted")
	}
}

func TestValidate(t *testing.T) {
	cp := sample()
	cp.Version = "v0"
	if err := cp.Validate(); err == nil {
		t.Fatal("wrong version accepted")
	}
	cp = sample()
	cp.Claims["uid-2"].State = "Half"
	if err := cp.Validate(); err == nil {
		t.Fatal("unknown state accepted")
	}
	cp = sample()
	cp.Claims["uid-1"].Devices[0].ComputePercent = 120
	if err := cp.Validate(); err == nil {
		t.Fatal("compute over 100 accepted")
	}
	cp = sample()
	cp.Refused[0].Reason = ""
	if err := cp.Validate(); err == nil {
		t.Fatal("refusal without a reason accepted")
	}
}

func TestEveryKindOfCorruptionIsErrCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	s := NewStore(path)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	wrongVersion := New()
	wrongVersion.Version = "fgpu.dev/checkpoint/v0"
	if err := s.Save(wrongVersion); err != nil {
		t.Fatal(err)
	}
	oldVersion, _ := os.ReadFile(path)
	for name, raw := range map[string][]byte{
		"truncated":     good[:len(good)/2],
		"garbage":       []byte("\x00\x01not json at all"),
		"empty":         {},
		"wrong version": oldVersion,
	} {
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: want ErrCorrupt, got %v", name, err)
		}
	}
}

func TestCopyAsideKeepsTheNewestFew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	s := NewStore(path)
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var aside []string
	for i := range KeepCorrupt + 2 {
		if err := os.WriteFile(path, []byte(fmt.Sprint("broken ", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := s.CopyAside(start.Add(time.Duration(i) * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		aside = append(aside, p)
	}
	if raw, err := os.ReadFile(path); err != nil || string(raw) != fmt.Sprint("broken ", KeepCorrupt+1) {
		t.Fatalf("the checkpoint must stay until Save replaces it: %q %v", raw, err)
	}
	left, _ := filepath.Glob(path + ".corrupt-*")
	if want := aside[len(aside)-KeepCorrupt:]; !reflect.DeepEqual(left, want) {
		t.Fatalf("kept %v, want the newest %v", left, want)
	}
	if raw, _ := os.ReadFile(aside[len(aside)-1]); string(raw) != fmt.Sprint("broken ", KeepCorrupt+1) {
		t.Fatalf("newest corrupt file holds %q", raw)
	}
}
