package billing

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/big"
	"mime"
	"mime/multipart"
	"net"
	"net/mail"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
)

var errTestSMTP = errors.New("test: mail server down")

// fakeSMTP is a minimal SMTP server: enough of RFC 5321 for net/smtp, with optional STARTTLS,
// implicit TLS and AUTH PLAIN. It records what it receives.
type fakeSMTP struct {
	ln       net.Listener
	tls      *tls.Config
	starttls bool

	mu       sync.Mutex
	messages []receivedMail
	wg       sync.WaitGroup
}

type receivedMail struct {
	From, To, Auth string
	TLS            bool
	Data           string
}

func newFakeSMTP(t *testing.T, implicitTLS, starttls bool) (*fakeSMTP, *x509.CertPool) {
	t.Helper()
	cert, pool := selfSigned(t)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if implicitTLS {
		ln = tls.NewListener(ln, cfg)
	}
	s := &fakeSMTP{ln: ln, tls: cfg, starttls: starttls}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s, pool
}

func (s *fakeSMTP) addr() string { return s.ln.Addr().String() }

func (s *fakeSMTP) received() []receivedMail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]receivedMail(nil), s.messages...)
}

func (s *fakeSMTP) serve() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close()
			s.session(conn)
		}()
	}
}

func (s *fakeSMTP) session(conn net.Conn) {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, isTLS := conn.(*tls.Conn)
	tp := textproto.NewConn(conn)
	reply := func(format string, args ...any) { _ = tp.PrintfLine(format, args...) }
	reply("220 fake ESMTP")
	var m receivedMail
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		cmd := strings.ToUpper(strings.SplitN(line, " ", 2)[0])
		arg := strings.TrimSpace(strings.TrimPrefix(line, strings.SplitN(line, " ", 2)[0]))
		switch cmd {
		case "EHLO", "HELO":
			lines := []string{"fake"}
			if s.starttls && !isTLS {
				lines = append(lines, "STARTTLS")
			}
			lines = append(lines, "AUTH PLAIN")
			for i, l := range lines {
				sep := "-"
				if i == len(lines)-1 {
					sep = " "
				}
				reply("250%s%s", sep, l)
			}
		case "STARTTLS":
			reply("220 go ahead")
			tc := tls.Server(conn, s.tls)
			if err := tc.Handshake(); err != nil {
				return
			}
			conn, isTLS = tc, true
			tp = textproto.NewConn(conn)
		case "AUTH":
			parts := strings.Fields(arg)
			if len(parts) == 2 && strings.EqualFold(parts[0], "PLAIN") {
				dec, _ := base64.StdEncoding.DecodeString(parts[1])
				m.Auth = string(dec)
			}
			reply("235 ok")
		case "MAIL":
			m.From = arg
			reply("250 ok")
		case "RCPT":
			m.To = arg
			reply("250 ok")
		case "DATA":
			reply("354 go on")
			data, err := tp.ReadDotBytes()
			if err != nil {
				return
			}
			m.Data, m.TLS = string(data), isTLS
			s.mu.Lock()
			s.messages = append(s.messages, m)
			s.mu.Unlock()
			m = receivedMail{}
			reply("250 queued")
		case "QUIT":
			reply("221 bye")
			return
		default:
			reply("250 ok")
		}
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// parseMail splits a received message into headers and its text and HTML parts.
func parseMail(t *testing.T, data string) (*mail.Message, string, string) {
	t.Helper()
	msg, err := mail.ReadMessage(strings.NewReader(data))
	if err != nil {
		t.Fatalf("read message: %v", err)
	}
	mediaType, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mediaType != "multipart/alternative" {
		t.Fatalf("content type %q: %v", msg.Header.Get("Content-Type"), err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	var text, html string
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(p) // multipart decodes quoted-printable
		switch {
		case strings.HasPrefix(p.Header.Get("Content-Type"), "text/plain"):
			text = string(b)
		case strings.HasPrefix(p.Header.Get("Content-Type"), "text/html"):
			html = string(b)
		}
	}
	return msg, text, html
}

func TestSendSMTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                  string
		scheme                string
		implicitTLS, starttls bool
		userinfo              string
		wantTLS               bool
		wantAuth              string
	}{
		{"plain smtp, no auth", "smtp", false, false, "", false, ""},
		{"smtp upgraded with STARTTLS, with auth", "smtp", false, true, "mailer:s3cret@", true, "\x00mailer\x00s3cret"},
		{"smtps implicit TLS, with auth", "smtps", true, false, "mailer:s3cret@", true, "\x00mailer\x00s3cret"},
	}
	n := renderedNotice{Subject: "Your payment failed — update your card", Text: "Pay here: https://invoice.example/i/1\n.\nline after a lone dot\n", HTML: "<p>Pay</p>"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, pool := newFakeSMTP(t, tc.implicitTLS, tc.starttls)
			cfg := MailConfig{SMTPURL: fmt.Sprintf("%s://%s%s", tc.scheme, tc.userinfo, srv.addr()), From: "Billing <billing@example.com>"}
			raw, err := buildMessage(cfg.From, "jane@example.com", n, at(0), "notice-1")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := sendSMTP(ctx, cfg, "jane@example.com", raw, pool); err != nil {
				t.Fatalf("send: %v", err)
			}
			got := srv.received()
			if len(got) != 1 {
				t.Fatalf("%d messages received", len(got))
			}
			m := got[0]
			if m.From != "FROM:<billing@example.com>" || m.To != "TO:<jane@example.com>" || m.TLS != tc.wantTLS || m.Auth != tc.wantAuth {
				t.Errorf("envelope from %q to %q tls %v auth %q", m.From, m.To, m.TLS, m.Auth)
			}
			msg, text, html := parseMail(t, m.Data)
			subject, _ := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
			if subject != n.Subject || msg.Header.Get("To") != "<jane@example.com>" || !strings.Contains(msg.Header.Get("From"), "billing@example.com") ||
				msg.Header.Get("Message-ID") == "" || msg.Header.Get("Date") == "" {
				t.Errorf("headers: %v", msg.Header)
			}
			if strings.ReplaceAll(text, "\r\n", "\n") != n.Text || html != n.HTML {
				t.Errorf("bodies:\n%q\n%q", text, html)
			}
		})
	}
}

// Credentials are never sent in clear text to a remote server: net/smtp refuses PLAIN auth
// without TLS unless the server is localhost, and the URL's password never appears in errors.
func TestSendSMTPErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	err = sendSMTP(ctx, MailConfig{SMTPURL: "smtp://u:topsecret@" + addr, From: "b@example.com"}, "x@example.com", []byte("x"), nil)
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("err = %v", err)
	}
	err = sendSMTP(ctx, MailConfig{SMTPURL: "smtp://u:topsecret@%zz", From: "b@example.com"}, "x@example.com", []byte("x"), nil)
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("bad URL err = %v", err)
	}
}

// The worker end to end over SMTP: render, build, send, mark.
func TestNoticeWorkerSendsOverSMTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1,
		URL: "https://invoice.stripe.com/i/in_1", NextAttempt: 86400}
	e.mustHandle(t, created("c1", 1, s1), failed("evt_f", 100, inv))

	srv, pool := newFakeSMTP(t, false, true)
	w := NewNoticeWorker(e.db, MailConfig{SMTPURL: "smtp://" + srv.addr(), From: "billing@example.com"}, nil)
	w.send = func(ctx context.Context, cfg MailConfig, to string, msg []byte) error {
		return sendSMTP(ctx, cfg, to, msg, pool)
	}
	if err := e.work(t, w, "evt_f", NoticePaymentFailed); err != nil {
		t.Fatal(err)
	}
	got := srv.received()
	if len(got) != 1 {
		t.Fatalf("%d mails", len(got))
	}
	_, text, html := parseMail(t, got[0].Data)
	if !strings.Contains(text, inv.URL) || !strings.Contains(text, "20.00 USD") || !strings.Contains(text, "June 2, 2024") ||
		!strings.Contains(html, `href="https://invoice.stripe.com/i/in_1"`) {
		t.Errorf("mail bodies:\n%s\n%s", text, html)
	}
	if d, r, ok := e.delivery(t, "evt_f"); d != "smtp" || r != "jane@example.com" || !ok {
		t.Errorf("delivery %q to %q sent %v", d, r, ok)
	}
}
