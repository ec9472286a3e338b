// Package logging holds the writer under the service's logs.
package logging

import (
	"io"
	"sync"
)

// Writer hands log lines to one goroutine that writes them to the underlying writer, in order,
// batching whatever accumulated since its last write.
//
// slog's handlers hold a mutex across each write(2). With a line per request, every request
// then queues behind the write of another's line, and when the kernel deschedules the goroutine
// inside that write (the CPU is shared with PostgreSQL), all of them stall: under load the
// entitlement endpoint's p99 went from 15 ms to over 700 ms that way. With Writer, a log call
// only copies its line into memory.
//
// Nothing is dropped: when more than maxPending bytes wait (the output is stuck), Write blocks
// until the writer goroutine catches up. What a crash can lose is the lines not yet written,
// normally well under a millisecond's worth. Close writes everything out; lines written after
// Close go straight to the underlying writer.
type Writer struct {
	out        io.Writer
	maxPending int

	mu      sync.Mutex
	space   sync.Cond // signalled when pending shrinks
	pending []byte
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	errOut  error // the last write error, for Close
	writeMu sync.Mutex
}

// DefaultMaxPending bounds the bytes waiting to be written.
const DefaultMaxPending = 1 << 20

// NewWriter starts a Writer on out. maxPending <= 0 means DefaultMaxPending.
func NewWriter(out io.Writer, maxPending int) *Writer {
	if maxPending <= 0 {
		maxPending = DefaultMaxPending
	}
	w := &Writer{out: out, maxPending: maxPending, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.space.L = &w.mu
	go w.loop()
	return w
}

// Write queues a copy of p. It blocks only while maxPending bytes are already waiting.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	for !w.closed && len(w.pending) > 0 && len(w.pending)+len(p) > w.maxPending {
		w.space.Wait()
	}
	if w.closed {
		w.mu.Unlock()
		// After the queued lines, so that the output keeps the order of the calls.
		<-w.done
		w.writeMu.Lock()
		defer w.writeMu.Unlock()
		return w.out.Write(p)
	}
	w.pending = append(w.pending, p...)
	select {
	case w.wake <- struct{}{}:
	default: // already woken; it takes this line too
	}
	w.mu.Unlock()
	return len(p), nil
}

func (w *Writer) loop() {
	defer close(w.done)
	var batch []byte
	for {
		_, open := <-w.wake
		w.mu.Lock()
		batch, w.pending = w.pending, batch[:0]
		w.space.Broadcast()
		w.mu.Unlock()
		if len(batch) > 0 {
			w.writeMu.Lock()
			if _, err := w.out.Write(batch); err != nil {
				w.errOut = err
			}
			w.writeMu.Unlock()
		}
		if !open {
			return
		}
	}
}

// Close writes out every queued line and stops the writer goroutine. It returns the last error
// the underlying writer returned, if any.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return w.errOut
	}
	w.closed = true
	w.space.Broadcast()
	w.mu.Unlock()
	close(w.wake)
	<-w.done
	return w.errOut
}
