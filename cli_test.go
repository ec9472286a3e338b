package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	_ "github.com/jackc/pgx/v5/stdlib"

	"billing/config"
	"billing/internal/stripeclient"
	"billing/internal/testenv"
)

// The CLI is tested as people meet it: the built binary, its exit code, stdout and stderr.

const (
	testVersion = "v9.9.9-clitest"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
)

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// cliBinary builds the binary once per test run, with the version and commit set as a release
// build sets them.
func cliBinary(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "billing-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "billing")
		cmd := exec.Command("go", "build", "-o", cliPath,
			"-ldflags", "-X main.version="+testVersion+" -X main.commit="+testCommit, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			cliErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliPath
}

type cliRun struct {
	code           int
	stdout, stderr string
}

// runCLI runs the binary with args in a clean environment (no BILLING_* of the test's own) plus
// env, from a temporary directory.
func runCLI(t *testing.T, env []string, args ...string) cliRun {
	t.Helper()
	return runCLIIn(t, t.TempDir(), env, args...)
}

// runCLIIn is runCLI in the directory dir.
func runCLIIn(t *testing.T, dir string, env []string, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(cliBinary(t), args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BILLING_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return cliRun{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func TestVersionNamesTheReleaseTheCommitAndTheStripeAPIVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--version", "version", "-version"} {
		r := runCLI(t, nil, arg)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("billing %s: exit %d, stderr %q", arg, r.code, r.stderr)
		}
		for _, want := range []string{"billing " + testVersion, testCommit, stripeclient.APIVersion} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("billing %s printed %q, lacking %q", arg, r.stdout, want)
			}
		}
	}
}

// commandsOf lists the commands that `billing -h` names.
func commandsOf(t *testing.T, usage string) []string {
	t.Helper()
	_, list, ok := strings.Cut(usage, "commands:\n")
	if !ok {
		t.Fatalf("usage has no command list:\n%s", usage)
	}
	var names []string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(line, "  ") {
			names = append(names, f[0])
		}
	}
	return names
}

// Every command answers -h with its usage, flags and environment on stdout, exit 0; the commands
// are the ones `billing -h` lists, so a new one is covered when it is listed.
func TestEveryCommandPrintsItsUsageWithH(t *testing.T) {
	t.Parallel()
	top := runCLI(t, nil, "-h")
	if top.code != 0 || top.stderr != "" {
		t.Fatalf("billing -h: exit %d, stderr %q", top.code, top.stderr)
	}
	names := commandsOf(t, top.stdout)
	for _, want := range []string{"serve", "migrate", "trigger"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+want+" ") {
			t.Errorf("billing -h lists %v, not %s", names, want)
		}
	}
	// Commands with subcommands answer -h on each subcommand.
	sub := map[string][]string{"stripe": {"stripe", "setup"}, "events": {"events", "tail"}}
	for _, name := range names {
		args := []string{name}
		if s, ok := sub[name]; ok {
			args = s
		}
		for _, h := range []string{"-h", "--help"} {
			r := runCLI(t, nil, append(args, h)...)
			cmd := strings.Join(args, " ")
			if r.code != 0 || r.stderr != "" {
				t.Errorf("billing %s %s: exit %d, stderr %q", cmd, h, r.code, r.stderr)
				continue
			}
			if !strings.HasPrefix(r.stdout, "usage: billing "+cmd) || !strings.Contains(r.stdout, "\nflags:\n") ||
				!strings.Contains(r.stdout, "\nenvironment") || !strings.Contains(r.stdout, config.ConfigEnv) {
				t.Errorf("billing %s %s printed no usage with flags and environment:\n%s", cmd, h, r.stdout)
			}
		}
	}
	serve := runCLI(t, nil, "serve", "-h").stdout
	for _, env := range config.EnvNames() {
		if !strings.Contains(serve, env) {
			t.Errorf("serve -h does not name %s", env)
		}
	}
	for cmd, env := range map[string]string{"migrate": "BILLING_DATABASE_URL", "trigger": "BILLING_STRIPE_WEBHOOK_SECRETS_TEST"} {
		if out := runCLI(t, nil, cmd, "-h").stdout; !strings.Contains(out, env) {
			t.Errorf("%s -h does not name %s:\n%s", cmd, env, out)
		}
	}
	for _, flag := range []string{"-customer", "-subscription", "-status", "-invoice", "-api-version", "-event-id"} {
		if out := runCLI(t, nil, "trigger", "-h").stdout; !strings.Contains(out, "  "+flag+" ") {
			t.Errorf("trigger -h lacks %s", flag)
		}
	}
}

// A wrong flag or argument is a usage error: exit 2, the usage on stderr, nothing on stdout.
func TestUsageErrorsGoToStderrWithExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"migrate", "--bogus"}, {"serve", "extra"}, {"trigger"}, {"nosuchcommand"}, {}} {
		r := runCLI(t, nil, args...)
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, "usage: billing") {
			t.Errorf("billing %v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
}

// An unreadable configuration file is one line with one prefix.
func TestConfigFileErrorIsOneLineWithOnePrefix(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "migrate", "--config", "/nonexistent/billing.yaml")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if r.code != exitUsage || len(lines) != 1 || !strings.HasPrefix(lines[0], "config: reading /nonexistent/billing.yaml: ") || strings.Count(lines[0], "config:") != 1 {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// An unreachable database is one readable log line: no format verbs, no encoding failures, the
// refusal said once, no password.
func TestUnreachableDatabaseIsOneLine(t *testing.T) {
	t.Parallel()
	r := runCLI(t, []string{"BILLING_DATABASE_URL=postgres://u:p@127.0.0.1:1/x"}, "migrate")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if r.code != exitFailure || len(lines) != 1 {
		t.Fatalf("exit %d, %d lines: %s", r.code, len(lines), r.stderr)
	}
	line := lines[0]
	for _, bad := range []string{"%v", "!ERROR", "func()", `\n`, `\t`, ":p@"} {
		if strings.Contains(line, bad) {
			t.Errorf("line has %q: %s", bad, line)
		}
	}
	if !strings.Contains(line, "cannot reach the database") || strings.Count(line, "connection refused") != 1 {
		t.Errorf("line does not say the database refused, once: %s", line)
	}
}

// emptyDatabaseURL is a new database without any migration (the package's test databases are
// migrated clones), dropped when the test ends.
func emptyDatabaseURL(t *testing.T) string {
	t.Helper()
	base := testenv.DatabaseURL(t)
	admin, err := sql.Open("pgx", testenv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := "cli_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	name = regexp.MustCompile(`[^a-z0-9_]`).ReplaceAllString(name, "")
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// Not on a terminal (a log file, a pipe), migrate logs a plain line per migration.
func TestMigrateLogsAPlainLinePerMigration(t *testing.T) {
	t.Parallel()
	dbURL := emptyDatabaseURL(t)
	r := runCLI(t, []string{"BILLING_DATABASE_URL=" + dbURL}, "migrate")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	sqlFiles, _ := filepath.Glob("migrations/*.sql")
	if n := strings.Count(r.stderr, `"msg":"migration applied","source":"billing"`); n != len(sqlFiles) || n == 0 {
		t.Errorf("%d lines for service migrations, want %d:\n%s", n, len(sqlFiles), r.stderr)
	}
	if strings.Contains(r.stderr, "\r") || strings.Contains(r.stderr, "migrating ") {
		t.Errorf("terminal progress in a log:\n%q", r.stderr)
	}
	if !strings.Contains(r.stderr, "migrations up to date") {
		t.Errorf("no closing line:\n%s", r.stderr)
	}
}

// openPTY opens a pseudo-terminal pair: what the child writes to tty, the test reads from pty.
func openPTY(t *testing.T) (pty, tty *os.File) {
	t.Helper()
	pty, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, pty.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatalf("unlockpt: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, pty.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("ptsname: %v", e)
	}
	tty, err = os.OpenFile("/dev/pts/"+itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return pty, tty
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// On a terminal, migrate shows where it is on one line rewritten in place, not a line each.
func TestMigrateShowsProgressOnATerminal(t *testing.T) {
	t.Parallel()
	dbURL := emptyDatabaseURL(t)
	pty, tty := openPTY(t)
	defer pty.Close()
	cmd := exec.Command(cliBinary(t), "migrate")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "BILLING_DATABASE_URL="+dbURL, "BILLING_LOG_FORMAT=text")
	cmd.Stderr = tty
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var screen bytes.Buffer
	copied := make(chan struct{})
	go func() {
		// Reading ends with EIO once the child, the last holder of the terminal, exits.
		_, _ = io.Copy(&screen, pty)
		close(copied)
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("migrate on a terminal: %v\n%s", err, screen.String())
	}
	select {
	case <-copied:
	case <-time.After(30 * time.Second):
		t.Fatal("terminal output never ended")
	}
	out := screen.String()
	if !strings.Contains(out, "\r\033[Kmigrating 1/") || !regexp.MustCompile(`migrated (\d+)/(\d+) in`).MatchString(out) {
		t.Errorf("no progress line on the terminal:\n%q", out)
	}
	if strings.Contains(out, "migration applied") {
		t.Errorf("a log line per migration on the terminal too:\n%q", out)
	}
	if m := regexp.MustCompile(`migrated (\d+)/(\d+) in`).FindStringSubmatch(out); m != nil && m[1] != m[2] {
		t.Errorf("finished at %s of %s", m[1], m[2])
	}
}
