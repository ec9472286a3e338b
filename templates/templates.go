// Package templates embeds the service's server-rendered templates: the admin console's pages
// under admin/ (html/template; package admin) and the customer notices under mail/ (per notice
// kind, a text/template with the subject and plain-text body and an html/template with the HTML
// body; package notices).
package templates

import (
	"embed"
	"io/fs"
)

//go:embed admin/*.html mail/*.txt mail/*.html
var files embed.FS

// FS holds admin/*.html and mail/<kind>.{txt,html}.
var FS fs.FS = files
