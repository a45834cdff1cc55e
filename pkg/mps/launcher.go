package mps

import "context"

// DaemonSpec is how one control daemon runs: Manager.Spec builds it, a Launcher runs it.
type DaemonSpec struct {
	Key, GPUUUID string
	// Command runs the control daemon in the foreground; Env holds its pipe and log
	// directories and its GPU.
	Command []string
	Env     []string
	// Dir is the daemon's directory (pipe, log and shm below it); the daemon must see it at
	// the same path, since its clients' CDI specs name these host paths.
	Dir     string
	PipeDir string
	// ShmDir is the daemon's /dev/shm, the directory its clients mount as theirs.
	ShmDir string
}

// Launcher runs control daemons outside the plugin's process, so that they outlive it.
type Launcher interface {
	// Start runs the daemon unless it is already there (then it is adopted as it is: a
	// second daemon for one key must never run). A daemon that exited is replaced; with
	// replace, so is one that runs (its daemon did not answer), though not one still
	// starting. created says a new daemon was started: the clients of any earlier one lost
	// their server.
	Start(ctx context.Context, spec DaemonSpec, replace bool) (created bool, err error)
	// Stop removes the daemon and returns once it is gone (bounded). Idempotent.
	Stop(ctx context.Context, key string) error
	// Keys lists the daemons launched on this node, running or not.
	Keys(ctx context.Context) ([]string, error)
	// Describe says, for a person, what the daemon is doing (why it does not answer).
	Describe(ctx context.Context, key string) string
}
