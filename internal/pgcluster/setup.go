package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// maxSocketPath is the longest unix socket path the kernel accepts
// (sizeof(sun_path) - 1 on Linux).
const maxSocketPath = 107

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
