// Package logging holds the writer under the service's logs.
package logging

import (
	"io"
	"sync"
	"time"
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
// The goroutine gathers lines for up to FlushDelay after the first one of a batch (less once
// flushBytes wait): under load one write(2) then carries dozens of lines instead of a few, and
// the goroutine wakes a few hundred times a second instead of once or twice per request. Each
// write and wake-up costs tens of microseconds on a shared VM, a fifth of what an entitlement
// read costs in all.
//
// Nothing is dropped: when more than maxPending bytes wait (the output is stuck), Write blocks
// until the writer goroutine catches up. What a crash can lose is the lines not yet written, at
// most FlushDelay's worth. Close writes everything out; lines written after Close go straight to
// the underlying writer.
type Writer struct {
	out        io.Writer
	maxPending int
	flushBytes int

	mu      sync.Mutex
	space   sync.Cond // signalled when pending shrinks
	pending []byte
	closed  bool
	wake    chan struct{} // a batch has begun
	full    chan struct{} // flushBytes are waiting: write them now
	stop    chan struct{} // closed by Close
	done    chan struct{}
	errOut  error // the last write error, for Close
	writeMu sync.Mutex
}

// DefaultMaxPending bounds the bytes waiting to be written.
const DefaultMaxPending = 1 << 20

// FlushDelay is the longest a line waits for others to share its write.
const FlushDelay = 5 * time.Millisecond

// defaultFlushBytes: a batch this large is written without waiting for the rest of FlushDelay.
const defaultFlushBytes = 64 << 10

// NewWriter starts a Writer on out. maxPending <= 0 means DefaultMaxPending.
func NewWriter(out io.Writer, maxPending int) *Writer {
	if maxPending <= 0 {
		maxPending = DefaultMaxPending
	}
	// A full queue (writers waiting) is always past flushBytes, so it is never left to wait.
	flushBytes := max(1, min(defaultFlushBytes, maxPending/2))
	w := &Writer{out: out, maxPending: maxPending, flushBytes: flushBytes, wake: make(chan struct{}, 1),
		full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
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
	first := len(w.pending) == 0
	w.pending = append(w.pending, p...)
	if first {
		signal(w.wake)
	}
	if len(w.pending) >= w.flushBytes {
		signal(w.full)
	}
	w.mu.Unlock()
	return len(p), nil
}

// signal wakes the goroutine waiting on c, if it is not woken already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (w *Writer) loop() {
	defer close(w.done)
	var batch []byte
	gather := time.NewTimer(FlushDelay)
	gather.Stop()
	for {
		stopped := false
		select {
		case <-w.wake:
			gather.Reset(FlushDelay)
			select {
			case <-gather.C:
			case <-w.full:
				gather.Stop()
			case <-w.stop:
				stopped = true
			}
		case <-w.stop:
			stopped = true
		}
		// After stop, Close has marked the writer closed: nothing more is queued after this batch.
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
		if stopped {
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
	close(w.stop)
	<-w.done
	return w.errOut
}
