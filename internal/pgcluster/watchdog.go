package pgcluster

import (
	"os"
	"os/exec"
	"syscall"
)

// startWatchdog spawns a tiny shell that blocks reading a pipe whose only
// writer is this process. If this process dies without calling Stop (crash,
// SIGKILL, test timeout) the pipe hits EOF and the watchdog fast-stops the
// server (SIGINT to the postmaster, what pg_ctl stop -m fast sends), so a
// pg_ctl-daemonized postmaster never outlives its owner, then deletes the
// temp socket dir (and Dir with RemoveOnExit). It runs as the current user
// (root may signal postgres and delete Dir, postgres might not be allowed to
// unlink Dir from its parent) and in its own process group so a terminal
// Ctrl-C doesn't kill it before it has done its job.
func (c *Cluster) startWatchdog() {
	r, w, err := os.Pipe()
	if err != nil {
		c.log.Warn("cannot start orphan watchdog", "err", err)
		return
	}
	defer r.Close()
	// The pid is read now, not when triggered, so a dying watchdog can never stop a later
	// instance that reuses the data directory.
	const script = `pid=
{ read pid < "$1/postmaster.pid"; } 2>/dev/null
read _
if [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null; then
	i=0
	while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
shift
[ $# -eq 0 ] || rm -rf -- "$@"`
	args := []string{"-c", script, "pgcluster-watchdog", c.dataDir}
	if c.sockTemp {
		args = append(args, c.sockDir)
	}
	if c.removeDir {
		args = append(args, c.dir)
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.Dir = "/"
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		c.log.Warn("cannot start orphan watchdog", "err", err)
		return
	}
	c.watchdog, c.wdPipe = cmd, w
}

func (c *Cluster) stopWatchdog() {
	if c.watchdog == nil {
		return
	}
	c.watchdog.Process.Kill()
	c.watchdog.Wait()
	c.wdPipe.Close()
	c.watchdog, c.wdPipe = nil, nil
}
