package httpserver_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"billing/internal/httpserver"
)

// countingReader counts the bytes read from it.
type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

func bodyRequest(body io.Reader, length int64) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", body)
	req.ContentLength = length
	return req
}

// Bodies are read only within the budget: a body the budget cannot hold is refused before a byte
// of it is read, and the reservation of a body comes back with release.
func TestByteBudgetBoundsBodiesHeldAtOnce(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	b := httpserver.NewByteBudget(2 * limit)

	// Two stalled uploads of the largest size: each has reserved its bytes while still sending.
	type upload struct {
		w    *io.PipeWriter
		done chan error
		free func()
	}
	var stalled []*upload
	for range 2 {
		pr, pw := io.Pipe()
		u := &upload{w: pw, done: make(chan error, 1)}
		req := bodyRequest(pr, limit)
		reserved := make(chan struct{})
		go func() {
			// The first write returns once ReadBody reads, which it does after reserving.
			_, release, err := b.ReadBody(req, limit)
			u.free = release
			u.done <- err
		}()
		go func() {
			_, _ = pw.Write([]byte("x"))
			close(reserved)
		}()
		<-reserved
		stalled = append(stalled, u)
	}
	if got := b.InUse(); got != 2*limit {
		t.Fatalf("in use %d with two stalled uploads, want %d", got, 2*limit)
	}

	// A third is refused unread, small or large.
	for _, n := range []int{10, limit} {
		cr := &countingReader{r: bytes.NewReader(make([]byte, n))}
		if _, _, err := b.ReadBody(bodyRequest(cr, int64(n)), limit); !errors.Is(err, httpserver.ErrBudgetSpent) {
			t.Errorf("body of %d bytes with the budget spent: %v, want ErrBudgetSpent", n, err)
		}
		if cr.read != 0 {
			t.Errorf("body of %d bytes: %d bytes read, want none", n, cr.read)
		}
	}

	// One upload finishes and is released: its bytes are free again.
	_, _ = stalled[0].w.Write(make([]byte, limit-1))
	if err := <-stalled[0].done; err != nil {
		t.Fatalf("finished upload: %v", err)
	}
	stalled[0].free()
	stalled[0].free() // releasing twice gives nothing back twice
	if got := b.InUse(); got != limit {
		t.Errorf("in use %d after one release, want %d", got, limit)
	}
	body, release, err := b.ReadBody(bodyRequest(bytes.NewReader([]byte("hello")), 5), limit)
	if err != nil || string(body) != "hello" {
		t.Fatalf("body after the release: %q, %v", body, err)
	}
	release()

	// The other is cut off by its client: its reservation comes back too.
	_ = stalled[1].w.CloseWithError(io.ErrUnexpectedEOF)
	if err := <-stalled[1].done; err == nil {
		t.Errorf("upload cut short: no error")
	}
	if got := b.InUse(); got != 0 {
		t.Errorf("in use %d with nothing in flight, want 0", got)
	}
}

func TestByteBudgetRefusesOversizedBodies(t *testing.T) {
	t.Parallel()
	const limit = 1 << 10
	b := httpserver.NewByteBudget(1 << 20)
	// Declared too long: refused unread.
	cr := &countingReader{r: bytes.NewReader(make([]byte, limit+1))}
	if _, _, err := b.ReadBody(bodyRequest(cr, limit+1), limit); !errors.Is(err, httpserver.ErrBodyTooLarge) || cr.read != 0 {
		t.Errorf("declared %d bytes: %v after reading %d bytes, want ErrBodyTooLarge unread", limit+1, err, cr.read)
	}
	// Of undeclared length (chunked): read up to the limit and one byte more.
	cr = &countingReader{r: bytes.NewReader(make([]byte, 10*limit))}
	if _, _, err := b.ReadBody(bodyRequest(cr, -1), limit); !errors.Is(err, httpserver.ErrBodyTooLarge) || cr.read > limit+1+512 {
		t.Errorf("undeclared length over the limit: %v after reading %d bytes", err, cr.read)
	}
	body, release, err := b.ReadBody(bodyRequest(bytes.NewReader([]byte("short")), -1), limit)
	if err != nil || string(body) != "short" {
		t.Errorf("undeclared length under the limit: %q, %v", body, err)
	}
	release()
	if got := b.InUse(); got != 0 {
		t.Errorf("in use %d, want 0", got)
	}
}
