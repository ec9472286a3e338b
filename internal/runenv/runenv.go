// Package runenv is how the tools find a service started by `make run`: serve writes what it
// runs on (its URL, its database, the dev Stripe, the test secret and the tokens) to
// .data/run.env, and doctor, reconcile, trigger and dev read it instead of starting a second
// embedded cluster or asking for flags. The file holds secrets of the dev loop only (test-mode
// secret, generated tokens) and is written 0600.
package runenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// File is the file's path relative to the checkout.
const File = ".data/run.env"

// ErrNotRunning says no running `make run` service was found: no file, or its process is gone.
var ErrNotRunning = errors.New("no running `make run` service found (" + File + ")")

// Env is what a running dev service says of itself. Keys are written as KEY=VALUE lines.
type Env struct {
	PID           int    // serve's process id; Find ignores the file when it is gone
	ServiceURL    string // http://localhost:8080
	DatabaseURL   string // the embedded cluster's URL
	StripeURL     string // the dev Stripe's base URL
	StripeKey     string // the secret key the service calls it with (sk_test_…)
	WebhookSecret string // the test-mode whsec_ the service verifies
	APIToken      string
	AdminToken    string
}

func (e Env) lines() map[string]string {
	return map[string]string{
		"PID": strconv.Itoa(e.PID), "SERVICE_URL": e.ServiceURL, "DATABASE_URL": e.DatabaseURL,
		"STRIPE_URL": e.StripeURL, "STRIPE_KEY": e.StripeKey, "WEBHOOK_SECRET": e.WebhookSecret,
		"API_TOKEN": e.APIToken, "ADMIN_TOKEN": e.AdminToken,
	}
}

// Write writes e to path atomically (a rename), readable by its owner only.
func Write(path string, e Env) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	m := e.lines()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by `billing serve` under `make run`; removed when it stops\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, m[k])
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Remove deletes path when it still names pid (a newer service may have replaced it).
func Remove(path string, pid int) {
	if e, err := Read(path); err == nil && e.PID == pid {
		os.Remove(path)
	}
}

// Read parses path. A missing file is ErrNotRunning.
func Read(path string) (Env, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Env{}, ErrNotRunning
	}
	if err != nil {
		return Env{}, err
	}
	defer f.Close()
	var e Env
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return Env{}, fmt.Errorf("%s: not KEY=VALUE: %q", path, line)
		}
		switch k {
		case "PID":
			if e.PID, err = strconv.Atoi(v); err != nil {
				return Env{}, fmt.Errorf("%s: PID: %w", path, err)
			}
		case "SERVICE_URL":
			e.ServiceURL = v
		case "DATABASE_URL":
			e.DatabaseURL = v
		case "STRIPE_URL":
			e.StripeURL = v
		case "STRIPE_KEY":
			e.StripeKey = v
		case "WEBHOOK_SECRET":
			e.WebhookSecret = v
		case "API_TOKEN":
			e.APIToken = v
		case "ADMIN_TOKEN":
			e.AdminToken = v
		}
	}
	return e, sc.Err()
}

// Find looks for File in dir and its parents and answers the first whose process is alive.
func Find(dir string) (Env, string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		p := filepath.Join(d, File)
		e, err := Read(p)
		if err == nil && alive(e.PID) {
			return e, p, nil
		}
		if err != nil && !errors.Is(err, ErrNotRunning) {
			return Env{}, p, err
		}
		if filepath.Dir(d) == d {
			return Env{}, "", ErrNotRunning
		}
	}
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
