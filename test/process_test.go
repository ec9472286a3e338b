// Package test holds the end-to-end tests: they build the real binary and drive it from outside,
// over HTTP and signals, as Stripe, the app backend and an operator do.
package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary builds bin/billing once per test run, into a temporary directory.
func binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "billing-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "billing")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// baseEnv is the environment of a service under test: nothing of the caller's BILLING_*.
func baseEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BILLING_") {
			env = append(env, kv)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// proc is a running `billing` process.
type proc struct {
	cmd  *exec.Cmd
	addr string
	// debugAddr is the profiler's address when the test set http.debug_addr through it.
	debugAddr string
	out       *syncBuffer
	done      chan struct{}
	err       error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The tokens and webhook secret start gives a service whose test sets none: serve refuses to
// start without them, and tokens need 32 characters or more.
const (
	e2eAPIToken      = "app-e2e-0123456789abcdef0123456789ab"
	e2eAdminToken    = "admin-e2e-0123456789abcdef0123456789ab"
	e2eWebhookSecret = "whsec_e2e_0123456789abcdef0123456789abcdef"
)

// start runs `billing serve` with env in dir and waits until it is ready.
func start(t testing.TB, dir string, env map[string]string) *proc {
	t.Helper()
	addr := freeAddr(t)
	full := map[string]string{
		"BILLING_HTTP_ADDR":                   addr,
		"BILLING_LOG_LEVEL":                   "debug",
		"BILLING_AUTH_API_TOKENS":             e2eAPIToken,
		"BILLING_AUTH_ADMIN_TOKENS":           e2eAdminToken,
		"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": e2eWebhookSecret,
	}
	for k, v := range env {
		full[k] = v
	}
	p := &proc{addr: addr, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(binary(t), "serve")
	p.cmd.Dir = dir
	p.cmd.Env = baseEnv(full)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start billing: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("billing output:\n%s", tail(p.out.String(), 4000))
		}
	})
	p.waitReady(t, 90*time.Second)
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (p *proc) url(path string) string { return "http://" + p.addr + path }

// waitReady polls /readyz; the deadline only bounds a failing start (initdb on a slow disk).
func (p *proc) waitReady(t testing.TB, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-p.done:
			t.Fatalf("billing exited before it was ready: %v\n%s", p.err, tail(p.out.String(), 4000))
		default:
		}
		resp, err := http.Get(p.url("/readyz"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("billing not ready after %s\n%s", limit, tail(p.out.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends sig and returns the exit code.
func (p *proc) stop(t testing.TB, sig syscall.Signal) int {
	t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("billing did not exit after %v", sig)
	}
	return p.cmd.ProcessState.ExitCode()
}

func runCmd(t testing.TB, dir string, env map[string]string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Dir = dir
	cmd.Env = baseEnv(env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	return cmd.ProcessState.ExitCode(), out.String()
}

func get(t testing.TB, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
