// Package mail builds MIME messages and delivers them over SMTP. It knows nothing of what the
// messages say: the notices package renders them.
package mail

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"net/url"
	"strings"
	"time"
)

// Config is where mail goes.
type Config struct {
	// SMTPURL is smtp://[user:pass@]host[:port] (STARTTLS when the server offers it) or
	// smtps://[user:pass@]host[:port] (implicit TLS).
	SMTPURL string
	From    string
	// RootCAs verify the server's certificate; nil is the system pool (tests pass their own CA).
	RootCAs *x509.CertPool
}

// Enabled reports whether mail can be sent at all: both the server and the sender are set.
func (c Config) Enabled() bool { return c.SMTPURL != "" && c.From != "" }

// Message is what a mail says: a subject line, and the same content as plain text and HTML.
type Message struct {
	Subject string
	Text    string
	HTML    string
}

// Build renders m as a MIME message: multipart/alternative with the plain-text and the HTML
// body, both quoted-printable UTF-8. idPart makes the Message-ID unique per message.
func Build(from, to string, m Message, date time.Time, idPart string) ([]byte, error) {
	fromAddr, err := mail.ParseAddress(from)
	if err != nil {
		return nil, fmt.Errorf("from address: %w", err)
	}
	toAddr, err := mail.ParseAddress(to)
	if err != nil {
		return nil, fmt.Errorf("recipient address: %w", err)
	}
	domain := "localhost"
	if at := strings.LastIndexByte(fromAddr.Address, '@'); at >= 0 {
		domain = fromAddr.Address[at+1:]
	}

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, part := range []struct{ typ, content string }{
		{"text/plain; charset=utf-8", m.Text},
		{"text/html; charset=utf-8", m.HTML},
	} {
		w, err := mw.CreatePart(textproto.MIMEHeader{
			"Content-Type":              {part.typ},
			"Content-Transfer-Encoding": {"quoted-printable"},
		})
		if err != nil {
			return nil, err
		}
		qp := quotedprintable.NewWriter(w)
		if _, err := qp.Write([]byte(part.content)); err != nil {
			return nil, err
		}
		if err := qp.Close(); err != nil {
			return nil, err
		}
	}
	if err := mw.Close(); err != nil {
		return nil, err
	}

	var msg bytes.Buffer
	header := func(k, v string) { fmt.Fprintf(&msg, "%s: %s\r\n", k, v) }
	header("From", fromAddr.String())
	header("To", toAddr.String())
	header("Subject", mime.QEncoding.Encode("utf-8", m.Subject))
	header("Date", date.Format(time.RFC1123Z))
	header("Message-ID", fmt.Sprintf("<%s.%d@%s>", idPart, date.UnixNano(), domain))
	header("MIME-Version", "1.0")
	header("Content-Type", "multipart/alternative; boundary="+mw.Boundary())
	msg.WriteString("\r\n")
	msg.Write(body.Bytes())
	return msg.Bytes(), nil
}

// Send delivers one message. smtp:// upgrades with STARTTLS when the server offers it;
// smtps:// speaks TLS from the start. Credentials in the URL are used with AUTH PLAIN, which
// net/smtp only sends over TLS (or to localhost). Errors never contain the URL's password.
func Send(ctx context.Context, cfg Config, to string, msg []byte) error {
	u, err := url.Parse(cfg.SMTPURL)
	if err != nil {
		return fmt.Errorf("mail.smtp_url: invalid URL")
	}
	host := u.Hostname()
	port := u.Port()
	implicitTLS := false
	switch u.Scheme {
	case "smtp":
		if port == "" {
			port = "25"
		}
	case "smtps":
		implicitTLS = true
		if port == "" {
			port = "465"
		}
	default:
		return fmt.Errorf("mail.smtp_url: unsupported scheme %q", u.Scheme)
	}
	fromAddr, err := mail.ParseAddress(cfg.From)
	if err != nil {
		return fmt.Errorf("mail.from: %w", err)
	}

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return fmt.Errorf("connect to mail server: %w", err)
	}
	defer conn.Close()
	// net/smtp has no contexts: the connection deadline bounds the whole conversation.
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	tlsConfig := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, RootCAs: cfg.RootCAs}
	if implicitTLS {
		tc := tls.Client(conn, tlsConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("tls handshake with mail server: %w", err)
		}
		conn = tc
	}
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		return fmt.Errorf("mail server greeting: %w", err)
	}
	defer c.Close()
	if !implicitTLS {
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(tlsConfig); err != nil {
				return fmt.Errorf("starttls: %w", err)
			}
		}
	}
	if u.User != nil && u.User.Username() != "" {
		pass, _ := u.User.Password()
		if err := c.Auth(smtp.PlainAuth("", u.User.Username(), pass, host)); err != nil {
			return fmt.Errorf("smtp auth: %w", err)
		}
	}
	if err := c.Mail(fromAddr.Address); err != nil {
		return fmt.Errorf("smtp MAIL FROM: %w", err)
	}
	if err := c.Rcpt(to); err != nil {
		return fmt.Errorf("smtp RCPT TO: %w", err)
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("smtp DATA: %w", err)
	}
	if _, err := w.Write(msg); err != nil {
		return fmt.Errorf("smtp DATA: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("smtp DATA: %w", err)
	}
	return c.Quit()
}
