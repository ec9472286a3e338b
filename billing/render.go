package billing

import (
	"fmt"
	htmltemplate "html/template"

	"billing/templates"
)

// pages are the parsed templates of the admin page.
type pages struct {
	admin *htmltemplate.Template
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
	return &pages{admin: admin}, nil
}
