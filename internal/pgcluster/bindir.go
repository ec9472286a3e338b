package pgcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

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
