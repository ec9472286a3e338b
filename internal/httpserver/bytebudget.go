package httpserver

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// ByteBudget bounds the bytes of request bodies held in memory at once by the requests that
// share it, whatever the number of connections: a body is read only once its bytes are reserved
// in the budget, and a request that finds the budget spent is refused at once, before a byte of
// its body is read.
//
// Why: the webhook endpoint must read a body whole before it can verify its signature, so anyone
// can make it hold one; a thousand slow uploads would otherwise hold a thousand bodies.
type ByteBudget struct {
	mu   sync.Mutex
	free int64
	size int64
}

// NewByteBudget returns a budget of size bytes.
func NewByteBudget(size int64) *ByteBudget { return &ByteBudget{free: size, size: size} }

// Size is the budget's size in bytes.
func (b *ByteBudget) Size() int64 { return b.size }

// InUse is how many bytes are reserved now.
func (b *ByteBudget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.size - b.free
}

func (b *ByteBudget) tryReserve(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.free {
		return false
	}
	b.free -= n
	return true
}

func (b *ByteBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.free += n
}

// Errors of ReadBody.
var (
	// ErrBodyTooLarge: the body is (or says it is) longer than the limit.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrBudgetSpent: the budget cannot hold the body now; the client should retry later.
	ErrBudgetSpent = errors.New("byte budget spent")
)

// ReadBody reads r's body, at most limit bytes, under the budget. It reserves the body's declared
// length (limit when it declares none, as a chunked upload does) before reading, so the bytes
// held never exceed the budget, and reads into a buffer of exactly that size (io.ReadAll would
// grow one to twice the body). release gives the reservation back; the caller calls it once it
// no longer needs the body (it is a no-op after an error). A body longer than its declared length
// cannot be sent: net/http ends it there.
func (b *ByteBudget) ReadBody(r *http.Request, limit int64) (body []byte, release func(), err error) {
	noop := func() {}
	n := limit + 1 // one more byte tells a body over the limit
	if r.ContentLength > limit {
		return nil, noop, ErrBodyTooLarge
	}
	if r.ContentLength >= 0 {
		n = r.ContentLength
	}
	if !b.tryReserve(n) {
		return nil, noop, ErrBudgetSpent
	}
	var once sync.Once
	release = func() { once.Do(func() { b.release(n) }) }
	buf := make([]byte, n)
	got, err := io.ReadFull(r.Body, buf)
	if err != nil && (r.ContentLength >= 0 || !(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF))) {
		// A body of undeclared length may end before the reservation; a declared one may not.
		release()
		return nil, noop, err
	}
	if int64(got) > limit {
		release()
		return nil, noop, ErrBodyTooLarge
	}
	return buf[:got], release, nil
}
