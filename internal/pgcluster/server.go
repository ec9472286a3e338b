package pgcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// startLocked runs pg_ctl start -w. With pickPort it chooses a free port and
// retries a few times, since another process may grab the port between our
// probe and the server's bind.
func (c *Cluster) startLocked(ctx context.Context, pickPort bool) error {
	if c.sockTemp {
		// Restart after Stop removed the temp socket dir.
		if err := os.MkdirAll(c.sockDir, 0o700); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if c.cred != nil {
			os.Chown(c.sockDir, int(c.cred.Uid), int(c.cred.Gid))
		}
	}
	rotateLog(c.logPath, 10<<20)
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if pickPort {
			if c.port, err = freePort(); err != nil {
				return fmt.Errorf("pgcluster: picking a port: %w", err)
			}
		}
		if err = c.writeConf(); err != nil {
			return err
		}
		logOffset := fileSize(c.logPath)
		secs := 60
		if dl, ok := ctx.Deadline(); ok {
			secs = max(1, int(time.Until(dl).Seconds()))
		}
		t0 := time.Now()
		_, err = c.run(ctx, "pg_ctl", "start", "-D", c.dataDir, "-l", c.logPath, "-w", "-t", strconv.Itoa(secs), "-s")
		if err == nil {
			c.running = true
			c.startWatchdog()
			c.log.Info("PostgreSQL started", "port", c.port, "sockdir", c.sockDir, "took", time.Since(t0))
			return nil
		}
		serverLog := readFrom(c.logPath, logOffset, 4096)
		err = fmt.Errorf("%w\n--- %s ---\n%s", err, c.logPath, serverLog)
		if ctx.Err() != nil {
			// pg_ctl was killed; don't leave a half-started postmaster behind.
			c.run(context.Background(), "pg_ctl", "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-s")
			return err
		}
		if !pickPort || !strings.Contains(serverLog, "Address already in use") {
			return err
		}
		c.log.Debug("port taken, retrying", "port", c.port)
	}
	return err
}

// Stop shuts the server down with pg_ctl stop -m fast (disconnects clients,
// clean shutdown). Stopping a stopped cluster is a no-op.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.stopLocked(ctx, "fast")
	c.cleanupSockDir()
	return err
}

// StopImmediate aborts the server (pg_ctl stop -m immediate), as in a crash;
// the next start performs crash recovery. For database-outage tests.
func (c *Cluster) StopImmediate() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.stopLocked(ctx, "immediate")
}

// Restart starts the server again on the same port and socket directory
// (fast-stopping it first if it is running). Pair with StopImmediate for
// outage tests: clients see the same URL come back.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stopLocked(ctx, "fast"); err != nil {
		return err
	}
	return c.startLocked(ctx, false)
}

func (c *Cluster) stopLocked(ctx context.Context, mode string) error {
	// Disarm the watchdog first so it cannot stop a later instance.
	c.stopWatchdog()
	if !c.running {
		return nil
	}
	secs := 60
	if dl, ok := ctx.Deadline(); ok {
		secs = max(1, int(time.Until(dl).Seconds()))
	}
	if _, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", mode, "-w", "-t", strconv.Itoa(secs), "-s"); err != nil {
		// Exit status 1 with "PID file ... does not exist" means it is
		// already down (e.g. killed externally).
		if _, statusErr := c.run(ctx, "pg_ctl", "status", "-D", c.dataDir); statusErr == nil {
			return err
		}
	}
	c.running = false
	os.Remove(c.ownerFile())
	c.log.Info("PostgreSQL stopped", "mode", mode)
	return nil
}

func (c *Cluster) cleanupSockDir() {
	if c.sockTemp {
		os.RemoveAll(c.sockDir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns what was appended to p since off (at most the last limit
// bytes, whole lines).
func readFrom(p string, off int64, limit int) string {
	f, err := os.Open(p)
	if err != nil {
		return "(no server log)"
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	var lines []string
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		n += len(sc.Text()) + 1
		for n > limit && len(lines) > 1 {
			n -= len(lines[0]) + 1
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// rotateLog keeps the long-lived embedded cluster's log from growing without
// bound: one previous generation is kept.
func rotateLog(p string, maxSize int64) {
	if fileSize(p) > maxSize {
		os.Rename(p, p+".1")
	}
}
