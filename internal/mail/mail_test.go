package mail

import (
	"context"
	"fmt"
	"mime"
	"net"
	"strings"
	"testing"
	"time"

	"billing/internal/mail/mailtest"
)

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
	m := Message{Subject: "Your payment failed — update your card", Text: "Pay here: https://invoice.example/i/1\n.\nline after a lone dot\n", HTML: "<p>Pay</p>"}
	date := time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, pool := mailtest.NewServer(t, tc.implicitTLS, tc.starttls)
			cfg := Config{SMTPURL: fmt.Sprintf("%s://%s%s", tc.scheme, tc.userinfo, srv.Addr()), From: "Billing <billing@example.com>", RootCAs: pool}
			raw, err := Build(cfg.From, "jane@example.com", m, date, "notice-1")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := Send(ctx, cfg, "jane@example.com", raw); err != nil {
				t.Fatalf("send: %v", err)
			}
			got := srv.Received()
			if len(got) != 1 {
				t.Fatalf("%d messages received", len(got))
			}
			r := got[0]
			if r.From != "FROM:<billing@example.com>" || r.To != "TO:<jane@example.com>" || r.TLS != tc.wantTLS || r.Auth != tc.wantAuth {
				t.Errorf("envelope from %q to %q tls %v auth %q", r.From, r.To, r.TLS, r.Auth)
			}
			msg, text, html := mailtest.Parse(t, r.Data)
			subject, _ := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
			if subject != m.Subject || msg.Header.Get("To") != "<jane@example.com>" || !strings.Contains(msg.Header.Get("From"), "billing@example.com") ||
				msg.Header.Get("Message-ID") == "" || msg.Header.Get("Date") == "" {
				t.Errorf("headers: %v", msg.Header)
			}
			if strings.ReplaceAll(text, "\r\n", "\n") != m.Text || html != m.HTML {
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
	err = Send(ctx, Config{SMTPURL: "smtp://u:topsecret@" + addr, From: "b@example.com"}, "x@example.com", []byte("x"))
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("err = %v", err)
	}
	err = Send(ctx, Config{SMTPURL: "smtp://u:topsecret@%zz", From: "b@example.com"}, "x@example.com", []byte("x"))
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("bad URL err = %v", err)
	}
}
