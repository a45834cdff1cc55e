package mps

import (
	"os"
	"path/filepath"
)

// SparePrefix begins the key of every spare daemon: one started ahead on a GPU so that the
// first domain that needs a daemon there takes one that already answers. A spare keeps its key
// when a domain takes it: the key is a directory name, and only the checkpoint says whose a
// daemon is.
const SparePrefix = "spare-"

// SpareMarker is the file in a spare's directory (beside, never inside, the directories its
// clients mount) that says no domain took it yet; taking the spare removes it. It holds
// SpareStarting until the daemon answers, then SpareReady: only a ready spare is taken.
const SpareMarker = "spare"

// What a SpareMarker holds.
const (
	SpareStarting = "starting\n"
	SpareReady    = "ready\n"
)

// MarkSpare writes daemon key's SpareMarker: SpareStarting before the daemon starts (a
// daemon found without the mark is a leak), SpareReady once it answers.
func (m *Manager) MarkSpare(key string, ready bool) error {
	path := filepath.Join(m.Root, key, SpareMarker)
	if !ready {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, []byte(SpareStarting), 0o644)
	}
	// Never recreates the directory of a spare stopped meanwhile.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(SpareReady); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// UnmarkSpare removes daemon key's SpareMarker: a domain took it.
func (m *Manager) UnmarkSpare(key string) error {
	if err := os.Remove(filepath.Join(m.Root, key, SpareMarker)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
