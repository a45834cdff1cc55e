// Package reaper waits for the processes that become the plugin's children without being
// started by it. The MPS control daemons detach from the command that starts them (a fork
// and setsid), so once that command exits they are orphans, and their parent becomes the
// nearest subreaper: the plugin, which is PID 1 of its container (or becomes a subreaper
// here, so that it is the same wherever it runs). Nobody waited for them, so each stopped
// daemon stayed behind as a zombie.
//
// The reaper must not take the exit status of a child that an exec.Cmd waits for (its Wait
// would fail), so it never waits for "any child". It waits by PID for zombie children that
// are not in the plugin's session: exec.Cmd children stay in it unless they call setsid,
// which daemons, and only they, do. A zombie child in the session that nobody waited for
// within Grace is reaped too: every command the plugin runs is waited for as soon as it ends.
package reaper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Grace is how long a zombie child in the plugin's own session is left to the code that
// started it.
const Grace = time.Minute

// Start makes the process a child subreaper and reaps its orphaned children on every SIGCHLD
// and every Grace/2, until ctx ends.
func Start(ctx context.Context) error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a child subreaper: %w", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	go func() {
		defer signal.Stop(sigs)
		ticker := time.NewTicker(Grace / 2)
		defer ticker.Stop()
		r := &reaper{seen: map[int]time.Time{}}
		for {
			r.reap(ctx, time.Now())
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			case <-ticker.C:
			}
		}
	}()
	return nil
}

type reaper struct {
	// seen is when each zombie child of the session was first seen.
	seen map[int]time.Time
}

func (r *reaper) reap(ctx context.Context, now time.Time) {
	logger := klog.FromContext(ctx)
	self := os.Getpid()
	sid, err := unix.Getsid(0)
	if err != nil {
		logger.Error(err, "Reading the plugin's session")
		return
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		logger.Error(err, "Listing processes to reap")
		return
	}
	zombies := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != self || st.state != 'Z' {
			continue
		}
		zombies[pid] = true
		if st.session == sid {
			first, ok := r.seen[pid]
			if !ok {
				r.seen[pid] = now
			}
			if !ok || now.Sub(first) < Grace {
				continue
			}
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil && !errors.Is(err, unix.ECHILD) {
			logger.Error(err, "Reaping an exited child", "pid", pid)
			continue
		}
		delete(r.seen, pid)
		logger.V(4).Info("Reaped an exited process the plugin did not wait for", "pid", pid, "status", ws.ExitStatus())
	}
	for pid := range r.seen {
		if !zombies[pid] {
			delete(r.seen, pid)
		}
	}
}

type stat struct {
	state         byte
	ppid, session int
}

// readStat reads state, parent and session from /proc/<pid>/stat, whose second field, the
// command name in parentheses, may itself hold spaces and parentheses.
func readStat(pid int) (stat, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	// state ppid pgrp session ...
	f := bytes.Fields(raw[i+1:])
	if len(f) < 4 || len(f[0]) != 1 {
		return stat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	session, err2 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil {
		return stat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return stat{state: f[0][0], ppid: ppid, session: session}, nil
}
