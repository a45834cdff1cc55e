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
// clients mount) that says no domain took it yet; taking the spare removes it.
const SpareMarker = "spare"

// MarkSpare writes or removes daemon key's SpareMarker.
func (m *Manager) MarkSpare(key string, spare bool) error {
	path := filepath.Join(m.Root, key, SpareMarker)
	if spare {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, nil, 0o644)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
