package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	stripeOnce sync.Once
	stripeURL  string
	stripeErr  error
	stripeCmd  *exec.Cmd
	stripeDone chan struct{} // closed when stripeCmd exits
	stripeWD   *os.File      // write end of the orphan watchdog's pipe
	stripeWCmd *exec.Cmd     // the watchdog
	stripeTmp  string        // dir of a binary we built ourselves
)

// StripeMockURL returns the base URL ("http://127.0.0.1:PORT") of a
// stripe-mock server shared by the whole test binary, starting it on first
// use. The binary is the module's `go tool stripe-mock` (pinned in go.mod).
func StripeMockURL(t testing.TB) string {
	t.Helper()
	stripeOnce.Do(func() { stripeURL, stripeErr = startStripeMock() })
	if stripeErr != nil {
		t.Fatal(stripeErr)
	}
	return stripeURL
}

func startStripeMock() (string, error) {
	if !mainCalled {
		return "", errors.New("testenv: call testenv.Main(m) from TestMain in this package (it stops stripe-mock)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := stripeMockBinary(ctx)
	if err != nil {
		return "", err
	}
	// The port is probed free and then handed over, so another process can
	// steal it in between: retry with a new port if the server exits early.
	var lastErr error
	for range 3 {
		u, err := runStripeMock(bin)
		if err == nil {
			return u, nil
		}
		lastErr = err
	}
	return "", lastErr
}

// stripeMockBinary returns a runnable stripe-mock executable. `go tool -n`
// builds the tool into the Go build cache (shared by all test binaries and
// runs, so it is compiled once per machine) and prints its path; running
// that path directly, rather than under `go tool`, means the process we
// kill is stripe-mock itself and not a go wrapper. Fallback: go build into a
// temp dir.
func stripeMockBinary(ctx context.Context) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		if gr := os.Getenv("GOROOT"); gr != "" {
			goBin = filepath.Join(gr, "bin", "go")
		} else {
			return "", fmt.Errorf("testenv: stripe-mock: go command not found: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, goBin, "tool", "-n", "stripe-mock")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if p := strings.TrimSpace(string(out)); err == nil && filepath.IsAbs(p) && !strings.ContainsAny(p, "\n ") {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	dir, err := os.MkdirTemp("", "billing-stripe-mock-")
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	stripeTmp = dir
	bin := filepath.Join(dir, "stripe-mock")
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/stripe/stripe-mock")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: building stripe-mock (is `tool github.com/stripe/stripe-mock` in go.mod?): %w\n%s", err, out)
	}
	return bin, nil
}

func runStripeMock(bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// HTTP only, loopback only: tests talk plain HTTP to it.
	cmd := exec.Command(bin, "-http-addr", addr, "-https-addr", "127.0.0.1:0")
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("testenv: starting stripe-mock: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()

	base := "http://" + addr
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			return "", fmt.Errorf("testenv: stripe-mock exited early: %s\n%s", cmd.ProcessState, output.String())
		default:
		}
		if resp, err := client.Get(base + "/"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return "", fmt.Errorf("testenv: stripe-mock did not answer on %s within 60s:\n%s", addr, output.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stripeCmd, stripeDone = cmd, done
	startStripeWatchdog(cmd.Process.Pid)
	return base, nil
}

// startStripeWatchdog kills stripe-mock if the test binary dies without
// running Main's teardown (test timeout panic, SIGKILL): a shell blocks on a
// pipe only we hold open and kills the pid when it reads EOF.
func startStripeWatchdog(pid int) {
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", `read _; kill -9 "$1" 2>/dev/null`, "stripe-mock-watchdog", strconv.Itoa(pid))
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return
	}
	stripeWCmd, stripeWD = cmd, w
}

func stopStripeMock() {
	// Disarm the watchdog first so it can never kill a recycled pid.
	if stripeWCmd != nil {
		stripeWCmd.Process.Kill()
		stripeWCmd.Wait()
		stripeWD.Close()
	}
	if stripeCmd != nil {
		stripeCmd.Process.Kill()
		<-stripeDone
	}
	if stripeTmp != "" {
		os.RemoveAll(stripeTmp)
	}
}

// moduleRoot walks up from the working directory (the package dir under go
// test) to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: go.mod not found above the working directory")
		}
		dir = parent
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
