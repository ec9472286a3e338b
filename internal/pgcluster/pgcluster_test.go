package pgcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testDir returns a fresh directory the postgres user can reach when tests
// run as root: t.TempDir() lives under a 0700 root-owned parent, so we use a
// direct child of os.TempDir() (normally the world-traversable /tmp) instead.
func testDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "pgcluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	// Tests create clusters in subdirectories too.
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func startCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })
	return c
}

func query(ctx context.Context, connString, sql string, args ...any) (string, error) {
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, sql, args...).Scan(&s)
	return s, err
}

func mustQuery(t *testing.T, connString, sql string, args ...any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := query(ctx, connString, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestFindBinDir(t *testing.T) {
	d, err := FindBinDir()
	if errors.Is(err, ErrNoServer) {
		t.Skip("no PostgreSQL server installed")
	}
	if err != nil {
		t.Fatal(err)
	}
	if !hasServerBinaries(d) {
		t.Fatalf("FindBinDir() = %s, which lacks server binaries", d)
	}
	t.Logf("bin dir: %s", d)
}

func TestCompareVersions(t *testing.T) {
	if compareVersions("9.6", "15") >= 0 || compareVersions("16", "15") <= 0 || compareVersions("15", "15") != 0 {
		t.Fatal("compareVersions is not numeric")
	}
}

func TestLifecycle(t *testing.T) {
	dir := testDir(t)
	c := startCluster(t, Options{Dir: dir, NoSync: true})
	url := c.URL("postgres")
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port()); url != want {
		t.Fatalf("URL = %s, want %s", url, want)
	}
	if got := mustQuery(t, url, "SELECT 1::text"); got != "1" {
		t.Fatalf("SELECT 1 = %q", got)
	}
	// The unix socket works too and lives in Dir/sock.
	if c.SocketDir() != filepath.Join(dir, "sock") {
		t.Fatalf("SocketDir = %s", c.SocketDir())
	}
	sockConn := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", c.SocketDir(), c.Port())
	if got := mustQuery(t, sockConn, "SHOW max_connections"); got != "200" {
		t.Fatalf("max_connections = %s", got)
	}
	if got := mustQuery(t, url, "SHOW fsync"); got != "off" {
		t.Fatalf("fsync with NoSync = %s", got)
	}
	if got := mustQuery(t, url, "SHOW server_encoding"); got != "UTF8" {
		t.Fatalf("server_encoding = %s", got)
	}
	if _, err := query(context.Background(), url, "CREATE TABLE kept AS SELECT 'yes'::text AS v"); err != pgx.ErrNoRows {
		t.Fatalf("CREATE TABLE: %v", err)
	}

	ctx := context.Background()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := query(ctx, url, "SELECT 1::text"); err == nil {
		t.Fatal("server still answers after Stop")
	}

	// Starting again on the same Dir reuses the data directory (no initdb),
	// and without NoSync fsync is back on.
	c2 := startCluster(t, Options{Dir: dir})
	url2 := c2.URL("postgres")
	if got := mustQuery(t, url2, "SELECT v FROM kept"); got != "yes" {
		t.Fatalf("data not kept across restart: %q", got)
	}
	if got := mustQuery(t, url2, "SHOW fsync"); got != "on" {
		t.Fatalf("fsync = %s", got)
	}

	// Outage: immediate stop, then Restart on the same port.
	port := c2.Port()
	if err := c2.StopImmediate(); err != nil {
		t.Fatalf("StopImmediate: %v", err)
	}
	if _, err := query(ctx, url2, "SELECT 1::text"); err == nil {
		t.Fatal("server still answers after StopImmediate")
	}
	if err := c2.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if c2.Port() != port || c2.URL("postgres") != url2 {
		t.Fatalf("Restart changed port %d -> %d", port, c2.Port())
	}
	if got := mustQuery(t, url2, "SELECT v FROM kept"); got != "yes" {
		t.Fatalf("after crash recovery: %q", got)
	}
	// Restart while running also works.
	if err := c2.Restart(ctx); err != nil {
		t.Fatalf("Restart while running: %v", err)
	}
	mustQuery(t, url2, "SELECT 1::text")
	if err := c2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAlreadyRunning(t *testing.T) {
	old := runningGrace
	runningGrace = 300 * time.Millisecond
	t.Cleanup(func() { runningGrace = old })

	dir := testDir(t)
	c := startCluster(t, Options{Dir: dir, NoSync: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c2, err := Start(ctx, Options{Dir: dir, NoSync: true})
	if err == nil {
		c2.Stop(ctx)
		t.Fatal("second Start on a live cluster succeeded")
	}
	if !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("err = %v, want ErrAlreadyRunning", err)
	}
	t.Logf("error: %v", err)
	if !strings.Contains(err.Error(), "stop -m fast") {
		t.Errorf("owned by this very process, the cluster cannot be told from a leftover and should be offered for stopping: %v", err)
	}
	mustQuery(t, c.URL("postgres"), "SELECT 1::text") // first one unharmed

	// Started by another live process (a running serve): in use, never offered for stopping.
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(fmt.Sprintf("%d\n", other.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Start(ctx, Options{Dir: dir, NoSync: true})
	if !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("err = %v, want ErrAlreadyRunning", err)
	}
	if strings.Contains(err.Error(), "stop -m fast") || !strings.Contains(err.Error(), fmt.Sprintf("process %d, which is still running", other.Process.Pid)) {
		t.Errorf("a cluster in use by a live process must be named as such and not offered for stopping: %v", err)
	}
	mustQuery(t, c.URL("postgres"), "SELECT 1::text")
}

func TestStalePidFile(t *testing.T) {
	dir := testDir(t)
	c := startCluster(t, Options{Dir: dir, NoSync: true})
	if err := c.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	// Simulate a pid file left by a crash whose pid now belongs to some
	// unrelated live process (here: this test binary).
	pidFile := filepath.Join(c.DataDir(), "postmaster.pid")
	content := fmt.Sprintf("%d\n%s\n0\n%d\n", os.Getpid(), c.DataDir(), c.Port())
	if err := os.WriteFile(pidFile, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := startCluster(t, Options{Dir: dir, NoSync: true})
	mustQuery(t, c2.URL("postgres"), "SELECT 1::text")
}

func TestLongDirUsesTempSocketDir(t *testing.T) {
	dir := filepath.Join(testDir(t), strings.Repeat("d", 60), strings.Repeat("e", 60))
	c := startCluster(t, Options{Dir: dir, NoSync: true})
	if strings.HasPrefix(c.SocketDir(), dir) {
		t.Fatalf("socket dir %s should have fallen back to a short temp dir", c.SocketDir())
	}
	mustQuery(t, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", c.SocketDir(), c.Port()), "SELECT 1::text")
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.SocketDir()); !os.IsNotExist(err) {
		t.Fatalf("temp socket dir not removed: %v", err)
	}
}

func TestFixedPort(t *testing.T) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, Options{Dir: testDir(t), NoSync: true, Port: port})
	if c.Port() != port {
		t.Fatalf("Port = %d, want %d", c.Port(), port)
	}
	mustQuery(t, c.URL("postgres"), "SELECT 1::text")
}

func TestInaccessibleDirAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only relevant when running as root")
	}
	dir := t.TempDir() // parent is 0700 root-owned
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Dir: dir, NoSync: true})
	if err == nil {
		c.Stop(ctx)
		t.Skip("t.TempDir() parent happens to be traversable")
	}
	if !strings.Contains(err.Error(), "not reachable by the postgres user") {
		t.Fatalf("unexpected error: %v", err)
	}
}

// TestWatchdogStopsOrphan runs a child process that starts a cluster and
// exits without stopping it; the watchdog must stop the server and, with
// RemoveOnExit, delete the directory.
func TestWatchdogStopsOrphan(t *testing.T) {
	if dir := os.Getenv("PGCLUSTER_TEST_ORPHAN_DIR"); dir != "" {
		c, err := Start(context.Background(), Options{Dir: dir, NoSync: true, RemoveOnExit: true})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println("PORT", c.Port())
		os.Exit(0) // no Stop: simulate a crash
	}
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	dir := filepath.Join(testDir(t), "orphan")
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogStopsOrphan$")
	cmd.Env = append(os.Environ(), "PGCLUSTER_TEST_ORPHAN_DIR="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	port := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "PORT "); ok {
			port, _ = strconv.Atoi(p)
		}
	}
	if port == 0 {
		t.Fatalf("child output: %s", out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		_, statErr := os.Stat(dir)
		if err != nil && os.IsNotExist(statErr) {
			break
		}
		if conn != nil {
			conn.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphaned server still up (dial err %v) or dir still present (%v)", err, statErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestStartHonorsContext(t *testing.T) {
	dir := testDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	c, err := Start(ctx, Options{Dir: dir, NoSync: true})
	if err == nil {
		c.Stop(context.Background())
		t.Fatal("Start finished within 100ms; cannot test the timeout")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	// A later Start with enough time initializes from scratch.
	c = startCluster(t, Options{Dir: dir, NoSync: true})
	mustQuery(t, c.URL("postgres"), "SELECT 1::text")
}
