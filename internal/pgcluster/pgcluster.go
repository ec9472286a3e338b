// Package pgcluster runs a private, self-managed PostgreSQL server from the
// locally installed server binaries (initdb/pg_ctl/postgres).
//
// It backs both the service's embedded default database (`billing serve`
// without a database URL) and the test harness (internal/testenv).
//
// Layout of Options.Dir:
//
//	Dir/data/          PGDATA (created by initdb on first Start)
//	Dir/sock/          unix socket directory (a short temp dir is used
//	                   instead when Dir is too deep for the 107-byte
//	                   sun_path limit)
//	Dir/postgres.log   server log (pg_ctl -l)
//
// Server settings live in Dir/data/pgcluster.conf, which is rewritten on every
// Start and included from postgresql.conf; passing them through a config file
// avoids pg_ctl's shell-quoted -o string entirely.
//
// initdb and postgres refuse to run as root. When the current process is
// root, Dir is chowned to the "postgres" system user and every server binary
// is run with that user's uid/gid (SysProcAttr.Credential, the in-process
// equivalent of `runuser -u postgres --`).
//
// Authentication is "trust" for local and 127.0.0.1 connections as user
// "postgres": the server is only meant for this machine's developer/test use.
package pgcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoServer is returned (wrapped) when no PostgreSQL server binaries can be
// found on this machine.
var ErrNoServer = errors.New("PostgreSQL server binaries not found: install the PostgreSQL server or set BILLING_DATABASE_URL")

// ErrAlreadyRunning is returned (wrapped) by Start when a live server that
// this Cluster did not start is already using the data directory.
var ErrAlreadyRunning = errors.New("a PostgreSQL server is already running on this data directory")

// Options configures Start.
type Options struct {
	// Dir is the cluster root (see the package doc for its layout). It is
	// created if missing. Required.
	Dir string
	// Logger receives lifecycle messages. Nil discards them.
	Logger *slog.Logger
	// Port is the TCP port on 127.0.0.1. 0 picks a free port on every Start
	// (Restart keeps the port of the running instance).
	Port int
	// NoSync trades durability for speed (tests): initdb --no-sync and
	// fsync/synchronous_commit/full_page_writes off. Never use it for data
	// you want to keep.
	NoSync bool
	// BinDir overrides FindBinDir.
	BinDir string
	// RemoveOnExit makes the orphan watchdog also delete Dir when this
	// process exits without calling Stop (crash, os.Exit, test timeout).
	// Intended for throwaway test clusters. Stop itself never deletes Dir.
	RemoveOnExit bool
}

// Cluster is a running (or stopped) PostgreSQL server owned by this process.
// Its methods are safe for concurrent use.
type Cluster struct {
	dir       string
	dataDir   string
	sockDir   string
	sockTemp  bool // sockDir is a fallback temp dir we must delete
	logPath   string
	binDir    string
	noSync    bool
	removeDir bool
	log       *slog.Logger
	cred      *syscall.Credential // non-nil when running binaries as postgres

	mu       sync.Mutex
	port     int
	running  bool
	watchdog *exec.Cmd
	wdPipe   *os.File // write end of the watchdog's stdin; closing it (or dying) triggers it
}

// runningGrace is how long Start waits for a live server on its data
// directory to go away (a variable so tests can shorten it).
var runningGrace = 5 * time.Second

// maxSocketPath is the longest unix socket path the kernel accepts
// (sizeof(sun_path) - 1 on Linux).
const maxSocketPath = 107

// FindBinDir locates a directory containing initdb, pg_ctl and postgres:
// `pg_config --bindir` if it has the server binaries (Debian's pg_config may
// come from libpq-dev without them), else the newest
// /usr/lib/postgresql/*/bin (Debian/Ubuntu) or /usr/pgsql-*/bin (RHEL), else
// the directory of initdb found on PATH (symlinks resolved). The error wraps
// ErrNoServer.
func FindBinDir() (string, error) {
	return findBinDir("")
}

// findBinDir prefers the binaries for major version want (if non-empty and
// installed), so an existing data directory keeps working when a newer
// server version is installed alongside.
func findBinDir(want string) (string, error) {
	var tried []string
	try := func(d string) bool {
		if d == "" {
			return false
		}
		tried = append(tried, d)
		return hasServerBinaries(d)
	}
	if want != "" {
		for _, d := range []string{"/usr/lib/postgresql/" + want + "/bin", "/usr/pgsql-" + want + "/bin"} {
			if try(d) {
				return d, nil
			}
		}
	}
	if pgc, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgc, "--bindir").Output(); err == nil {
			if d := strings.TrimSpace(string(out)); try(d) {
				return d, nil
			}
		}
	}
	var cands []string
	for _, pat := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		m, _ := filepath.Glob(pat)
		cands = append(cands, m...)
	}
	// Newest major version first ("9.6" < "15" numerically, not lexically).
	slices.SortFunc(cands, func(a, b string) int { return compareVersions(versionOf(b), versionOf(a)) })
	for _, d := range cands {
		if try(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && try(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if try(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	if len(tried) == 0 {
		return "", ErrNoServer
	}
	return "", fmt.Errorf("%w (looked in %s)", ErrNoServer, strings.Join(tried, ", "))
}

func hasServerBinaries(dir string) bool {
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionOf extracts "15" from "/usr/lib/postgresql/15/bin" or
// "/usr/pgsql-15/bin".
func versionOf(binDir string) string {
	base := filepath.Base(filepath.Dir(binDir))
	return strings.TrimPrefix(base, "pgsql-")
}

func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// Start initializes the cluster in opts.Dir on first use and starts the
// server, waiting until it accepts connections. ctx bounds the whole
// operation (initdb included).
//
// If postmaster.pid names a dead process, or a live process that is not a
// postgres server for this data directory (pid reuse after a reboot), the
// file is stale and the server starts normally. If a live server owns the
// data directory (for example another process's cluster), Start waits
// briefly — a crashed predecessor's watchdog may be shutting it down — and
// then fails with an error wrapping ErrAlreadyRunning.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgcluster: Options.Dir is required")
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("pgcluster: invalid port %d", opts.Port)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{
		dir:       dir,
		dataDir:   filepath.Join(dir, "data"),
		logPath:   filepath.Join(dir, "postgres.log"),
		noSync:    opts.NoSync,
		removeDir: opts.RemoveOnExit,
		log:       opts.Logger,
		port:      opts.Port,
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.log = c.log.With("component", "pgcluster", "dir", dir)

	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root requires a %q system user to own the cluster (PostgreSQL refuses to run as root): %w", "postgres", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("pgcluster: bad uid/gid for user postgres: %q/%q", u.Uid, u.Gid)
		}
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}

	// Pick binaries matching an existing data directory's major version.
	pgVersion := ""
	if b, err := os.ReadFile(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		pgVersion = strings.TrimSpace(string(b))
	}
	c.binDir = opts.BinDir
	if c.binDir == "" {
		if c.binDir, err = findBinDir(pgVersion); err != nil {
			return nil, err
		}
	} else if !hasServerBinaries(c.binDir) {
		return nil, fmt.Errorf("pgcluster: %w (BinDir %s lacks initdb/pg_ctl/postgres)", ErrNoServer, c.binDir)
	}

	if err := c.prepareDirs(); err != nil {
		return nil, err
	}
	if pgVersion == "" {
		if err := c.initdb(ctx); err != nil {
			c.cleanupSockDir()
			return nil, err
		}
	} else if err := c.checkVersion(ctx, pgVersion); err != nil {
		c.cleanupSockDir()
		return nil, err
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkNotRunning(ctx); err != nil {
		c.cleanupSockDir()
		return nil, err
	}
	if err := c.startLocked(ctx, opts.Port == 0); err != nil {
		c.cleanupSockDir()
		return nil, err
	}
	// Best effort: without the file, a second Start only loses the better advice.
	_ = os.WriteFile(c.ownerFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	return c, nil
}

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

// prepareDirs creates Dir (0700) and the socket dir, and when root hands
// them to the postgres user.
func (c *Cluster) prepareDirs() error {
	// Missing ancestors get 0755 so the postgres user can traverse them
	// when we are root; Dir itself is private.
	if err := os.MkdirAll(filepath.Dir(c.dir), 0o755); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.Mkdir(c.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("pgcluster: %w", err)
	}
	// A 5-digit port gives the longest socket name.
	c.sockDir = filepath.Join(c.dir, "sock")
	if len(c.sockDir)+len("/.s.PGSQL.65535") > maxSocketPath {
		base := os.TempDir()
		if len(base) > 40 {
			base = "/tmp"
		}
		d, err := os.MkdirTemp(base, "pgsock-")
		if err != nil {
			return fmt.Errorf("pgcluster: socket dir: %w", err)
		}
		c.sockDir, c.sockTemp = d, true
		c.log.Debug("cluster dir too deep for a unix socket path; using temp socket dir", "sockdir", d)
	} else if err := os.Mkdir(c.sockDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred == nil {
		return nil
	}
	if err := chownTree(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("pgcluster: handing %s to user postgres: %w", c.dir, err)
	}
	if c.sockTemp {
		if err := os.Chown(c.sockDir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	// postgres must be able to traverse every ancestor of Dir; a typical
	// failure is t.TempDir(), whose parent is a 0700 root-owned directory.
	for _, d := range []string{c.dir, c.sockDir} {
		if p := inaccessibleAncestor(d, c.cred.Uid, c.cred.Gid); p != "" {
			c.cleanupSockDir()
			return fmt.Errorf("pgcluster: %s is not reachable by the postgres user because %s lacks search (x) permission for it; use a directory under %s or make the parents traversable", d, p, os.TempDir())
		}
	}
	return nil
}

func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// inaccessibleAncestor returns the first ancestor of dir that uid/gid cannot
// search, or "". Supplementary groups and ACLs are ignored (conservative
// enough for the root → postgres case).
func inaccessibleAncestor(dir string, uid, gid uint32) string {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return p
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			perm := fi.Mode().Perm()
			var can bool
			switch {
			case st.Uid == uid:
				can = perm&0o100 != 0
			case st.Gid == gid:
				can = perm&0o010 != 0
			default:
				can = perm&0o001 != 0
			}
			if !can {
				return p
			}
		}
		if p == filepath.Dir(p) {
			return ""
		}
	}
}

// initdb creates the data directory in a scratch location and renames it
// into place, so a crash mid-initdb never leaves a half-initialized Dir/data.
func (c *Cluster) initdb(ctx context.Context) error {
	if _, err := os.Stat(c.dataDir); err == nil {
		return fmt.Errorf("pgcluster: %s exists but has no PG_VERSION; it is not a PostgreSQL data directory (remove it to re-initialize)", c.dataDir)
	}
	tmp := c.dataDir + ".initdb"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	args := []string{"-D", tmp, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"}
	if c.noSync {
		args = append(args, "--no-sync")
	}
	c.log.Info("initializing PostgreSQL data directory", "datadir", c.dataDir, "bindir", c.binDir)
	t0 := time.Now()
	if _, err := c.run(ctx, "initdb", args...); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	f, err := os.OpenFile(filepath.Join(tmp, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = io.WriteString(f, "\n# Settings managed by billing/internal/pgcluster (rewritten on every start).\ninclude_if_exists = 'pgcluster.conf'\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, c.dataDir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("pgcluster: finishing initdb: %w", err)
	}
	c.log.Debug("initdb done", "took", time.Since(t0))
	return nil
}

// checkVersion turns the server's cryptic "incompatible data directory"
// failure into an actionable error.
func (c *Cluster) checkVersion(ctx context.Context, dataVersion string) error {
	out, err := c.run(ctx, "postgres", "--version")
	if err != nil {
		return err
	}
	// "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
	f := strings.Fields(out)
	if len(f) < 3 {
		return nil
	}
	binVersion := f[2]
	major, _, _ := strings.Cut(binVersion, ".")
	if dataVersion != major && !strings.HasPrefix(binVersion, dataVersion+".") {
		return fmt.Errorf("pgcluster: data directory %s was initialized by PostgreSQL %s but the server binaries in %s are version %s; install PostgreSQL %s server binaries (or pg_upgrade / remove the directory, losing its data)", c.dataDir, dataVersion, c.binDir, binVersion, dataVersion)
	}
	return nil
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

func (c *Cluster) writeConf() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by billing/internal/pgcluster on every start; edits are overwritten.\n")
	fmt.Fprintf(&b, "port = %d\n", c.port)
	fmt.Fprintf(&b, "listen_addresses = '127.0.0.1'\n")
	fmt.Fprintf(&b, "unix_socket_directories = %s\n", quoteConf(c.sockDir))
	fmt.Fprintf(&b, "max_connections = 200\n")
	fmt.Fprintf(&b, "shared_buffers = 128MB\n")
	if c.noSync {
		fmt.Fprintf(&b, "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
	} else {
		fmt.Fprintf(&b, "fsync = on\n")
	}
	p := filepath.Join(c.dataDir, "pgcluster.conf")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}

func quoteConf(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

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

// URL returns a connection URL for dbname over TCP.
func (c *Cluster) URL(dbname string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(dbname))
}

// BinDir is the directory of the server binaries in use.
func (c *Cluster) BinDir() string { return c.binDir }

// Port is the TCP port on 127.0.0.1.
func (c *Cluster) Port() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.port
}

// SocketDir is the unix socket directory (host= for libpq/pgx).
func (c *Cluster) SocketDir() string { return c.sockDir }

// DataDir is PGDATA.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogPath is the server log file.
func (c *Cluster) LogPath() string { return c.logPath }

// env gives server binaries a predictable environment: English messages
// (we grep the log for "Address already in use") and no PG* variables
// that could redirect pg_ctl.
func (c *Cluster) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// run executes a server binary (as postgres when root) and returns its
// stdout; failures carry stderr.
func (c *Cluster) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	// cwd must be readable by postgres: initdb/postgres call getcwd().
	cmd.Dir = c.dir
	cmd.Env = c.env()
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Don't hang if a daemonized child inherited our pipes.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return stdout.String(), fmt.Errorf("pgcluster: %s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
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
