package test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"billing/webhooks"
)

const (
	// benchUnsignedUploads stalled uploads of benchUnsignedBytes each (issue 22, finding 4: 500 of
	// them took the service from 47 MB to 631 MB before the byte budget).
	benchUnsignedUploads = 1000
	benchUnsignedBytes   = 1 << 20
	// benchUnsignedTargetRSS is the bound, in MB, of the service's peak RSS under them: its own
	// ~50 MB, the budget's 32 MiB of bodies, and the connections' buffers.
	benchUnsignedTargetRSS = 200
)

// BenchmarkUnsignedUploads holds benchUnsignedUploads connections open at once, each sending a
// delivery with a well-formed but wrong Stripe-Signature and a body of benchUnsignedBytes, all
// but its last byte, then stalling: the most memory an unsigned caller can make the service hold.
// The byte budget (webhooks.body_budget_mib) lets as many bodies be read as it holds and answers
// the others 503 busy before reading them; the service's peak RSS (VmHWM) is reported against
// benchUnsignedTargetRSS. BENCH_UNSIGNED_UPLOADS sets another number of uploads.
func BenchmarkUnsignedUploads(b *testing.B) {
	uploads := benchUnsignedUploads
	if n, err := strconv.Atoi(os.Getenv("BENCH_UNSIGNED_UPLOADS")); err == nil && n > 0 {
		uploads = n
	}
	d := startBenchDB(b)
	p := startBenchService(b, d, nil)
	pid := p.cmd.Process.Pid
	before := benchRSS(b, pid, "VmRSS:")

	body := bytes.Repeat([]byte("x"), benchUnsignedBytes-1)
	header := fmt.Sprintf("POST /webhooks/stripe HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Stripe-Signature: t=%d,v1=%s\r\nContent-Length: %d\r\n\r\n", p.addr, time.Now().Unix(), strings.Repeat("ab", 32), benchUnsignedBytes)

	var refused, otherAnswers, dialErrs atomic.Int64
	var sent sync.WaitGroup
	conns := make([]net.Conn, uploads)
	dial := make(chan struct{}, 64) // dials at once: the listen backlog is finite
	start := time.Now()
	for i := range uploads {
		sent.Add(1)
		go func() {
			defer sent.Done()
			dial <- struct{}{}
			c, err := net.Dial("tcp", p.addr)
			<-dial
			if err != nil {
				dialErrs.Add(1)
				return
			}
			conns[i] = c
			// A refused upload is answered (and its connection closed) while it is still
			// writing; its write then fails, which is the point.
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					return // closed by us at the end: a stalled upload never answered
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					refused.Add(1)
				} else {
					otherAnswers.Add(1)
				}
			}()
			if _, err := c.Write([]byte(header)); err == nil {
				_, _ = c.Write(body)
			}
		}()
	}
	sent.Wait()
	// Every upload has sent what it will; wait for the refusals to arrive, then for the peak to
	// settle (the budget's bodies are read by then).
	waitUntil(time.Minute, func() bool {
		return refused.Load()+otherAnswers.Load()+dialErrs.Load() >= int64(uploads)-benchBudgetBodies()
	})
	peak := benchRSS(b, pid, "VmHWM:")
	elapsed := time.Since(start)
	for _, c := range conns {
		if c != nil {
			_ = c.Close()
		}
	}
	held := int64(uploads) - refused.Load() - otherAnswers.Load() - dialErrs.Load()

	// The service is still whole: a signed delivery is received.
	client := benchHTTPClient()
	ok := waitUntil(30*time.Second, func() bool {
		id := fmt.Sprintf("evt_unsigned_after_%d", time.Now().UnixNano())
		ev := atkSubEvent(id, "customer.subscription.created", false, "sub_"+id, "cus_unsigned", "active", time.Now())
		return benchPostEvent(client, p.url("/webhooks/stripe"), ev) == nil
	})

	b.ReportMetric(peak, "peak-RSS-MB")
	b.ReportMetric(before, "idle-RSS-MB")
	verdict := fmt.Sprintf("target < %d MB met", benchUnsignedTargetRSS)
	if peak >= benchUnsignedTargetRSS {
		verdict = fmt.Sprintf("ABOVE TARGET %d MB", benchUnsignedTargetRSS)
	}
	b.Logf("unsigned uploads: %d stalled uploads of %d bytes in %s: %d bodies held by the budget, %d refused 503 busy, %d other answers, %d dial errors; RSS idle %.0f MB, peak %.0f MB (%s); a signed delivery after: %v",
		uploads, benchUnsignedBytes, elapsed.Round(time.Millisecond), held, refused.Load(), otherAnswers.Load(), dialErrs.Load(), before, peak, verdict, ok)
	if !ok {
		b.Errorf("the service received no signed delivery after the uploads")
	}
}

// benchBudgetBodies is how many stalled bodies of benchUnsignedBytes the default budget holds.
func benchBudgetBodies() int64 { return webhooks.DefaultBodyBudget / benchUnsignedBytes }

// benchRSS is a /proc/PID/status figure (VmRSS: now, VmHWM: the peak) in MB.
func benchRSS(b *testing.B, pid int, field string) float64 {
	b.Helper()
	if field == "VmHWM:" {
		return benchPeakRSS(b, pid)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				b.Fatalf("%s %q", field, line)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no %s in /proc status", field)
	return 0
}
