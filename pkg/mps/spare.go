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
// daemon found without the mark is a leak), SpareReady once it answers. The mark is replaced
// whole, never seen half written.
func (m *Manager) MarkSpare(key string, ready bool) error {
	dir := filepath.Join(m.Root, key)
	content := SpareReady
	if !ready {
		content = SpareStarting
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	// A ready mark never recreates the directory of a spare stopped meanwhile: the temporary
	// file cannot be made there.
	tmp := filepath.Join(dir, "."+SpareMarker)
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, SpareMarker))
}

// UnmarkSpare removes daemon key's SpareMarker: a domain took it.
func (m *Manager) UnmarkSpare(key string) error {
	if err := os.Remove(filepath.Join(m.Root, key, SpareMarker)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
