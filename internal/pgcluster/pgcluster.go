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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
