package billing

import (
	"bytes"
	"fmt"
	htmltemplate "html/template"
	"strconv"
	"strings"
	texttemplate "text/template"
	"time"

	"billing/templates"
)

// pages are the parsed templates of the admin page and of each notice kind.
type pages struct {
	admin  *htmltemplate.Template
	notice map[string]noticeTemplates
}

type noticeTemplates struct {
	text *texttemplate.Template // defines "subject" and "text"
	html *htmltemplate.Template // defines "html"
}

func mustParsePages() *pages {
	p, err := parsePages()
	if err != nil {
		panic(err)
	}
	return p
}

func parsePages() (*pages, error) {
	admin, err := htmltemplate.New("").ParseFS(templates.FS, "admin/admin.html")
	if err != nil {
		return nil, fmt.Errorf("billing: parse admin template: %w", err)
	}
	p := &pages{admin: admin, notice: map[string]noticeTemplates{}}
	for _, kind := range []string{NoticeTrialWillEnd, NoticePaymentFailed} {
		txt, err := texttemplate.New("").ParseFS(templates.FS, "mail/"+kind+".txt")
		if err != nil {
			return nil, fmt.Errorf("billing: parse %s text template: %w", kind, err)
		}
		html, err := htmltemplate.New("").ParseFS(templates.FS, "mail/"+kind+".html")
		if err != nil {
			return nil, fmt.Errorf("billing: parse %s html template: %w", kind, err)
		}
		p.notice[kind] = noticeTemplates{text: txt, html: html}
	}
	return p, nil
}

// noticeView is what the notice templates see: values already formatted for people.
type noticeView struct {
	Kind               string
	SubscriptionID     string
	InvoiceID          string
	Livemode           bool
	TrialEnd           string
	Amount             string
	HostedInvoiceURL   string
	NextPaymentAttempt string
	AttemptCount       int64
}

// renderedNotice is a notice ready to be mailed or logged.
type renderedNotice struct {
	Subject string
	Text    string
	HTML    string
}

func (p *pages) renderNotice(a NoticeArgs) (renderedNotice, error) {
	t, ok := p.notice[a.NoticeKind]
	if !ok {
		return renderedNotice{}, fmt.Errorf("unknown notice kind %q", a.NoticeKind)
	}
	v := noticeView{
		Kind:             a.NoticeKind,
		SubscriptionID:   a.SubscriptionID,
		InvoiceID:        a.InvoiceID,
		Livemode:         a.Livemode,
		TrialEnd:         formatDate(a.TrialEnd),
		Amount:           formatAmount(a.AmountDue, a.Currency),
		HostedInvoiceURL: safeURL(a.HostedInvoiceURL),
		// Retries are scheduled to the minute; the day alone would hide same-day retries.
		NextPaymentAttempt: formatTime(a.NextPaymentAttempt),
		AttemptCount:       a.AttemptCount,
	}
	var subject, text, html bytes.Buffer
	if err := t.text.ExecuteTemplate(&subject, "subject", v); err != nil {
		return renderedNotice{}, err
	}
	if err := t.text.ExecuteTemplate(&text, "text", v); err != nil {
		return renderedNotice{}, err
	}
	if err := t.html.ExecuteTemplate(&html, "html", v); err != nil {
		return renderedNotice{}, err
	}
	return renderedNotice{
		// A header line: no newlines, whatever a template does.
		Subject: strings.Join(strings.Fields(subject.String()), " "),
		Text:    text.String(),
		HTML:    html.String(),
	}, nil
}

// safeURL keeps only http(s) links (html/template would neuter others; the text part must too).
func safeURL(u string) string {
	if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
		return u
	}
	return ""
}

func formatDate(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("January 2, 2006")
}

func formatTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("January 2, 2006 15:04 MST")
}

// Currencies whose Stripe amounts are not in hundredths (https://docs.stripe.com/currencies).
var (
	zeroDecimal = map[string]bool{
		"bif": true, "clp": true, "djf": true, "gnf": true, "jpy": true, "kmf": true, "krw": true,
		"mga": true, "pyg": true, "rwf": true, "ugx": true, "vnd": true, "vuv": true, "xaf": true,
		"xof": true, "xpf": true,
	}
	threeDecimal = map[string]bool{"bhd": true, "jod": true, "kwd": true, "omr": true, "tnd": true}
)

// formatAmount renders Stripe's minor units as "12.34 USD"; "" when unknown.
func formatAmount(amount *int64, currency string) string {
	if amount == nil {
		return ""
	}
	cur := strings.ToLower(currency)
	decimals := 2
	switch {
	case zeroDecimal[cur]:
		decimals = 0
	case threeDecimal[cur]:
		decimals = 3
	}
	v := *amount
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	s := strconv.FormatInt(v, 10)
	if decimals > 0 {
		if len(s) <= decimals {
			s = strings.Repeat("0", decimals-len(s)+1) + s
		}
		s = s[:len(s)-decimals] + "." + s[len(s)-decimals:]
	}
	out := sign + s
	if cur != "" {
		out += " " + strings.ToUpper(cur)
	}
	return out
}
