package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runningGrace is how long Start waits for a live server on its data
// directory to go away (a variable so tests can shorten it).
var runningGrace = 5 * time.Second

// ownerFile names the process that started the running server, so that another Start can tell a
// cluster in use from a leftover.
func (c *Cluster) ownerFile() string { return filepath.Join(c.dir, "owner.pid") }

// liveOwner is the pid of ownerFile when that process is alive and is not this one, else 0.
func (c *Cluster) liveOwner() int {
	b, err := os.ReadFile(c.ownerFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return 0
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0
	}
	return pid
}

// checkNotRunning inspects postmaster.pid (see Start's doc).
func (c *Cluster) checkNotRunning(ctx context.Context) error {
	pidFile := filepath.Join(c.dataDir, "postmaster.pid")
	deadline := time.Now().Add(runningGrace)
	for {
		pid, port, live := c.pidFileOwner(pidFile)
		if !live {
			return nil
		}
		if owner := c.liveOwner(); owner > 0 {
			// A process of ours runs this cluster (a `billing serve` of make run): it is in use,
			// not a leftover, and stopping it would pull the database from under that process.
			return fmt.Errorf("pgcluster: %w: postgres pid %d (port %s) is using %s for process %d, which is still running; connect to it (its URL is in .data/run.env under make run) instead of starting it again",
				ErrAlreadyRunning, pid, port, c.dataDir, owner)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: %w: postgres pid %d (port %s) is using %s. If that is a leftover from an earlier run, stop it with: %s -D %s stop -m fast",
				ErrAlreadyRunning, pid, port, c.dataDir, filepath.Join(c.binDir, "pg_ctl"), c.dataDir)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: %w (postgres pid %d still owns %s)", ctx.Err(), pid, c.dataDir)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pidFileOwner reports whether postmaster.pid names a live server for this
// data directory. Stale files whose pid now belongs to an unrelated process
// are removed, since postgres itself would refuse to start because of them.
func (c *Cluster) pidFileOwner(pidFile string) (pid int, port string, live bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, "", false
	}
	lines := strings.Split(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return 0, "", false // garbage; postgres overwrites it
	}
	if len(lines) > 3 {
		port = strings.TrimSpace(lines[3])
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return pid, port, false // dead: postgres removes the stale file itself
	}
	if runtime.GOOS == "linux" {
		stale := false
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) != "postgres" {
			stale = true
		} else if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
			// The postmaster chdirs into its data directory.
			want, _ := filepath.EvalSymlinks(c.dataDir)
			stale = want != "" && cwd != want && cwd != c.dataDir
		}
		if stale {
			c.log.Warn("removing stale postmaster.pid (pid now belongs to another process)", "pid", pid)
			os.Remove(pidFile)
			return pid, port, false
		}
	}
	return pid, port, true
}
