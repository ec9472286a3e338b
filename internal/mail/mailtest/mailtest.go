// Package mailtest is a minimal SMTP server for tests: enough of RFC 5321 for net/smtp, with
// optional STARTTLS, implicit TLS and AUTH PLAIN. It records what it receives.
package mailtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
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

// Server is a running fake SMTP server; it stops when the test ends.
type Server struct {
	ln       net.Listener
	tls      *tls.Config
	starttls bool

	mu       sync.Mutex
	messages []Received
	wg       sync.WaitGroup
}

// Received is one message as the server saw it: the envelope (MAIL FROM / RCPT TO arguments),
// the decoded AUTH PLAIN string, whether the session was encrypted, and the DATA.
type Received struct {
	From, To, Auth string
	TLS            bool
	Data           string
}

// NewServer starts a server on 127.0.0.1 with a certificate of its own; the returned pool
// trusts it. implicitTLS makes it an smtps server; starttls makes a plain one offer STARTTLS.
func NewServer(t testing.TB, implicitTLS, starttls bool) (*Server, *x509.CertPool) {
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
	s := &Server{ln: ln, tls: cfg, starttls: starttls}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s, pool
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Received returns the messages received so far.
func (s *Server) Received() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Received(nil), s.messages...)
}

func (s *Server) serve() {
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

func (s *Server) session(conn net.Conn) {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, isTLS := conn.(*tls.Conn)
	tp := textproto.NewConn(conn)
	reply := func(format string, args ...any) { _ = tp.PrintfLine(format, args...) }
	reply("220 fake ESMTP")
	var m Received
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
			m = Received{}
			reply("250 queued")
		case "QUIT":
			reply("221 bye")
			return
		default:
			reply("250 ok")
		}
	}
}

func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool) {
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

// Parse splits a received message into its headers and its text and HTML parts.
func Parse(t testing.TB, data string) (*mail.Message, string, string) {
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
