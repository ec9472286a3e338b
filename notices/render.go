package notices

import (
	"bytes"
	"fmt"
	htmltemplate "html/template"
	"strings"
	texttemplate "text/template"

	"billing/internal/display"
	"billing/internal/mail"
	"billing/templates"
)

// renderer holds the parsed templates of each notice kind.
type renderer struct {
	byKind map[string]kindTemplates
}

type kindTemplates struct {
	text *texttemplate.Template // defines "subject" and "text"
	html *htmltemplate.Template // defines "html"
}

// mustParseTemplates panics: the templates are embedded, so a parse error is a build bug.
func mustParseTemplates() *renderer {
	t, err := parseTemplates()
	if err != nil {
		panic(err)
	}
	return t
}

func parseTemplates() (*renderer, error) {
	t := &renderer{byKind: map[string]kindTemplates{}}
	for _, kind := range []string{KindTrialWillEnd, KindPaymentFailed, KindPaymentActionRequired} {
		txt, err := texttemplate.New("").ParseFS(templates.FS, "mail/"+kind+".txt")
		if err != nil {
			return nil, fmt.Errorf("notices: parse %s text template: %w", kind, err)
		}
		html, err := htmltemplate.New("").ParseFS(templates.FS, "mail/"+kind+".html")
		if err != nil {
			return nil, fmt.Errorf("notices: parse %s html template: %w", kind, err)
		}
		t.byKind[kind] = kindTemplates{text: txt, html: html}
	}
	return t, nil
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

// render makes the mail of a notice, ready to be sent or logged.
func (t *renderer) render(a Args) (mail.Message, error) {
	kt, ok := t.byKind[a.NoticeKind]
	if !ok {
		return mail.Message{}, fmt.Errorf("unknown notice kind %q", a.NoticeKind)
	}
	v := noticeView{
		Kind:             a.NoticeKind,
		SubscriptionID:   a.SubscriptionID,
		InvoiceID:        a.InvoiceID,
		Livemode:         a.Livemode,
		TrialEnd:         display.Date(a.TrialEnd),
		Amount:           display.Amount(a.AmountDue, a.Currency),
		HostedInvoiceURL: display.SafeURL(a.HostedInvoiceURL),
		// Retries are scheduled to the minute; the day alone would hide same-day retries.
		NextPaymentAttempt: display.Time(a.NextPaymentAttempt),
		AttemptCount:       a.AttemptCount,
	}
	var subject, text, html bytes.Buffer
	if err := kt.text.ExecuteTemplate(&subject, "subject", v); err != nil {
		return mail.Message{}, err
	}
	if err := kt.text.ExecuteTemplate(&text, "text", v); err != nil {
		return mail.Message{}, err
	}
	if err := kt.html.ExecuteTemplate(&html, "html", v); err != nil {
		return mail.Message{}, err
	}
	return mail.Message{
		// A header line: no newlines, whatever a template does.
		Subject: strings.Join(strings.Fields(subject.String()), " "),
		Text:    text.String(),
		HTML:    html.String(),
	}, nil
}
