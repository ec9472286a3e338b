package runenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReadFind(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, File)
	want := Env{PID: os.Getpid(), ServiceURL: "http://localhost:8080", DatabaseURL: "postgres://x@127.0.0.1:5432/billing",
		StripeURL: "http://127.0.0.1:12111", StripeKey: "sk_test_123", WebhookSecret: "whsec_abc", APIToken: "app_x", AdminToken: "admin_y"}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	sub := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	got, p, err := Find(sub)
	if err != nil || p != path || got != want {
		t.Fatalf("Find = %+v, %q, %v; want %+v at %q", got, p, err, want, path)
	}
	// A file left by a process that is gone is not a running service.
	dead := want
	dead.PID = 1 << 30
	if err := Write(path, dead); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Find(sub); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Find with a dead PID: %v, want ErrNotRunning", err)
	}
	Remove(path, want.PID) // not ours any more: kept
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Remove took another process's file: %v", err)
	}
	Remove(path, dead.PID)
	if _, err := Read(path); !errors.Is(err, ErrNotRunning) {
		t.Errorf("after Remove: %v", err)
	}
}
