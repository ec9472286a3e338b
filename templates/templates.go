// Package templates embeds the service's server-rendered templates: the admin pages (html/template)
// and the customer notices (a text/template with the subject and plain-text body, and an
// html/template with the HTML body, per notice kind).
package templates

import (
	"embed"
	"io/fs"
)

//go:embed admin/*.html mail/*.txt mail/*.html
var files embed.FS

// FS holds admin/*.html and mail/<kind>.{txt,html}.
var FS fs.FS = files
