package logging_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"billing/internal/logging"
)

// lockedBuffer is a concurrency-safe output that can be held shut.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	gate   chan struct{} // when non-nil, each Write waits until it is closed
	err    error
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	if l.gate != nil {
		<-l.gate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	l.b.Write(p)
	return len(p), l.err
}

func (l *lockedBuffer) Writes() int { l.mu.Lock(); defer l.mu.Unlock(); return l.writes }

func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func TestWriterKeepsEveryLineWholeAndInOrder(t *testing.T) {
	t.Parallel()
	for _, maxPending := range []int{0, 64} { // the default, and a tiny one that forces waits
		t.Run(fmt.Sprint(maxPending), func(t *testing.T) {
			t.Parallel()
			out := &lockedBuffer{}
			w := logging.NewWriter(out, maxPending)
			const writers, lines = 8, 500
			var wg sync.WaitGroup
			for g := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range lines {
						line := fmt.Sprintf("writer=%d line=%d %s\n", g, i, strings.Repeat("x", i%40))
						if n, err := w.Write([]byte(line)); err != nil || n != len(line) {
							t.Errorf("write: %d, %v", n, err)
						}
					}
				}()
			}
			wg.Wait()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			next := make([]int, writers)
			got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(got) != writers*lines {
				t.Fatalf("%d lines written, want %d", len(got), writers*lines)
			}
			for _, line := range got {
				var g, i int
				if _, err := fmt.Sscanf(line, "writer=%d line=%d", &g, &i); err != nil {
					t.Fatalf("torn line %q: %v", line, err)
				}
				if want := fmt.Sprintf("writer=%d line=%d %s", g, i, strings.Repeat("x", i%40)); line != want {
					t.Fatalf("line %q, want %q", line, want)
				}
				if i != next[g] {
					t.Fatalf("writer %d: line %d after line %d", g, i, next[g]-1)
				}
				next[g]++
			}
		})
	}
}

// A stuck output makes writers wait once maxPending bytes are queued; nothing is dropped.
func TestWriterBlocksInsteadOfDropping(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		out := &lockedBuffer{gate: make(chan struct{})}
		w := logging.NewWriter(out, 10)
		if _, err := w.Write([]byte("0123456789")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()                                          // the writer goroutine holds the first line, stuck in the output
		if _, err := w.Write([]byte("abcdefghij")); err != nil { // queued: exactly maxPending
			t.Fatal(err)
		}
		third := make(chan struct{})
		go func() {
			_, _ = w.Write([]byte("KLMNOPQRST"))
			close(third)
		}()
		synctest.Wait() // every goroutine is blocked: the third write waits for room
		select {
		case <-third:
			t.Fatal("a write returned while the queue was full and the output stuck")
		default:
		}
		close(out.gate)
		<-third
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if got, want := out.String(), "0123456789abcdefghijKLMNOPQRST"; got != want {
			t.Errorf("output %q, want %q", got, want)
		}
	})
}

func TestWriterAfterCloseWritesThrough(t *testing.T) {
	t.Parallel()
	out := &lockedBuffer{}
	w := logging.NewWriter(out, 0)
	_, _ = w.Write([]byte("before\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte("after\n"))
	if err := w.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	if got := out.String(); got != "before\nafter\n" {
		t.Errorf("output %q", got)
	}
}

func TestWriterCloseReportsOutputError(t *testing.T) {
	t.Parallel()
	boom := errors.New("disk full")
	w := logging.NewWriter(&lockedBuffer{err: boom}, 0)
	_, _ = w.Write([]byte("line\n"))
	if err := w.Close(); !errors.Is(err, boom) {
		t.Errorf("Close: %v, want %v", err, boom)
	}
}

// A burst of lines waits at most FlushDelay, without Close, and goes out in one write.
func TestWriterGathersABurstIntoOneWrite(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		out := &lockedBuffer{}
		w := logging.NewWriter(out, 0)
		defer w.Close()
		var want strings.Builder
		for i := range 50 {
			line := fmt.Sprintf("request %d\n", i)
			want.WriteString(line)
			if _, err := w.Write([]byte(line)); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if got := out.String(); got != "" {
			t.Fatalf("written before FlushDelay: %q", got)
		}
		time.Sleep(logging.FlushDelay)
		synctest.Wait()
		if got := out.String(); got != want.String() {
			t.Fatalf("after FlushDelay: %q, want %q", got, want.String())
		}
		if n := out.Writes(); n != 1 {
			t.Errorf("%d writes for one burst, want 1", n)
		}
	})
}

// Half of maxPending waiting is written at once, without waiting for FlushDelay.
func TestWriterWritesALargeBatchAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		out := &lockedBuffer{}
		w := logging.NewWriter(out, 1000)
		defer w.Close()
		if _, err := w.Write([]byte(strings.Repeat("a", 499))); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := out.String(); got != "" {
			t.Fatalf("a small batch was written before FlushDelay: %d bytes", len(got))
		}
		if _, err := w.Write([]byte("b")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // no time passes in the bubble unless every goroutine waits on it
		if got := out.String(); got != strings.Repeat("a", 499)+"b" {
			t.Errorf("500 of 1000 bytes waiting were not written at once: %d bytes out", len(got))
		}
	})
}
