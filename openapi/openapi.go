// Package openapi holds the OpenAPI 3.1 document of the service's HTTP API (openapi.yaml,
// embedded), serves it as GET /openapi.json, and checks answers against it: the tests of package
// main compare it with the routes newApp registers and validate the answers they get.
//
// The checker covers the part of JSON Schema the document uses: $ref (inside the document),
// allOf, oneOf, anyOf, type (one or a list, "null" included), properties, required, items, enum,
// minimum, maximum, the date-time format and additionalProperties. Unlike JSON Schema, an object
// checked against a schema that lists properties may carry no member the schema (with its allOf
// branches and the oneOf/anyOf branches it fits) does not list, unless additionalProperties
// says true or gives the members a schema: the document describes every field, not only some.
package openapi

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.yaml.in/yaml/v3"
)

//go:embed openapi.yaml
var source []byte

// Path is where the document is served.
const Path = "/openapi.json"

var (
	docJSON []byte
	doc     map[string]any
)

func init() {
	var v any
	if err := yaml.Unmarshal(source, &v); err != nil {
		panic(fmt.Sprintf("openapi: openapi.yaml: %v", err))
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("openapi: openapi.yaml as JSON: %v", err))
	}
	docJSON = b
	if err := json.Unmarshal(b, &doc); err != nil {
		panic(fmt.Sprintf("openapi: %v", err))
	}
}

// JSON returns the document as JSON.
func JSON() []byte { return slices.Clone(docJSON) }

// Mount serves the document at Path, unauthenticated.
func Mount(e *echo.Echo) {
	e.GET(Path, func(c echo.Context) error {
		return c.JSONBlob(http.StatusOK, docJSON)
	})
}

// Operation is a documented method and path template ("/v1/customers/{user_id}").
type Operation struct{ Method, Path string }

var methods = []string{"get", "put", "post", "delete", "patch", "head", "options"}

// Operations lists the documented operations, sorted.
func Operations() []Operation {
	var out []Operation
	for path, item := range obj(doc["paths"]) {
		for _, m := range methods {
			if _, ok := obj(item)[m]; ok {
				out = append(out, Operation{Method: strings.ToUpper(m), Path: path})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out
}

var paramSegment = regexp.MustCompile(`^\{[^/{}]+\}$`)

// Match returns the documented path template that a request path falls under. A literal
// segment beats a parameter, as in the router.
func Match(method, path string) (string, bool) {
	segs := strings.Split(path, "/")
	best, bestScore := "", -1
	for _, op := range Operations() {
		if op.Method != method {
			continue
		}
		tsegs := strings.Split(op.Path, "/")
		if len(tsegs) != len(segs) {
			continue
		}
		score := 0
		for i, t := range tsegs {
			switch {
			case t == segs[i]:
				score++
			case paramSegment.MatchString(t) && segs[i] != "":
			default:
				score = -1
			}
			if score < 0 {
				break
			}
		}
		if score > bestScore {
			best, bestScore = op.Path, score
		}
	}
	return best, bestScore >= 0
}

// CheckResponse checks an answer to method and path (a request path, not a template) against the
// document: the operation exists, the status is documented (or a default answer is), the content
// type is one the answer may have, and a JSON body fits the schema.
func CheckResponse(method, path string, status int, contentType string, body []byte) error {
	tpl, ok := Match(method, path)
	if !ok {
		return fmt.Errorf("%s %s: not in the document", method, path)
	}
	op := obj(obj(obj(doc["paths"])[tpl])[strings.ToLower(method)])
	responses := obj(op["responses"])
	resp, ok := responses[strconv.Itoa(status)]
	if !ok {
		resp, ok = responses["default"]
	}
	if !ok {
		return fmt.Errorf("%s %s: status %d is not documented", method, tpl, status)
	}
	r := obj(resolve(resp))
	content := obj(r["content"])
	if len(content) == 0 {
		return nil
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return fmt.Errorf("%s %s %d: content type %q: %v", method, tpl, status, contentType, err)
	}
	media, ok := content[mt]
	if !ok {
		return fmt.Errorf("%s %s %d: content type %s, documented %v", method, tpl, status, mt, keys(content))
	}
	schema, ok := obj(media)["schema"]
	if !ok || mt != "application/json" {
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%s %s %d: body is not JSON: %v", method, tpl, status, err)
	}
	if errs := Validate(schema, v); len(errs) > 0 {
		return fmt.Errorf("%s %s %d: %w", method, tpl, status, errors.Join(errs...))
	}
	return nil
}

// Schema returns a schema of the document's components by name, for Validate.
func Schema(name string) (any, bool) {
	s, ok := obj(obj(doc["components"])["schemas"])[name]
	return s, ok
}

// Validate checks a decoded JSON value against a schema of the document.
func Validate(schema, value any) []error {
	var errs []error
	validate(schema, value, "$", &errs)
	return errs
}

// members is what the parts of one schema (itself, its allOf branches, the oneOf/anyOf branches
// the value fits) say about an object's members. The member check waits until every part is
// seen, so that a member one allOf branch declares is not unknown to another.
type members struct {
	declared map[string]bool
	closed   bool  // a part lists properties (or says additionalProperties: false)
	open     bool  // a part says additionalProperties: true
	extra    []any // the additionalProperties schemas
}

func (m *members) merge(o members) {
	for name := range o.declared {
		m.declare(name)
	}
	m.closed = m.closed || o.closed
	m.open = m.open || o.open
	m.extra = append(m.extra, o.extra...)
}

func (m *members) declare(name string) {
	if m.declared == nil {
		m.declared = map[string]bool{}
	}
	m.declared[name] = true
}

// validate checks v against schema, members included: an object checked against a schema that
// lists properties may carry no other member, unless additionalProperties allows it (true) or
// describes it (a schema, which the member must fit). The document must name every field an
// answer carries, not only the required ones.
func validate(schema, v any, at string, errs *[]error) {
	var m members
	shape(schema, v, at, errs, &m)
	x, ok := v.(map[string]any)
	if !ok || (!m.closed && len(m.extra) == 0) {
		return // free-form
	}
	for _, name := range keys(x) {
		switch {
		case m.declared[name]: // its value was checked by shape
		case len(m.extra) > 0:
			for _, sub := range m.extra {
				validate(sub, x[name], at+"."+name, errs)
			}
		case !m.open:
			*errs = append(*errs, fmt.Errorf("%s: field %q is not in the document", at, name))
		}
	}
}

// shape checks v against schema except for undeclared members, and gathers into m what the
// schema's parts say about members. The values of declared members are checked in full.
func shape(schema, v any, at string, errs *[]error, m *members) {
	s := obj(resolve(schema))
	for _, sub := range list(s["allOf"]) {
		shape(sub, v, at, errs, m)
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		branches, ok := s[kw]
		if !ok {
			continue
		}
		var fits int
		var misfits []error
		for _, sub := range list(branches) {
			var be []error
			var bm members
			shape(sub, v, at, &be, &bm)
			if len(be) == 0 {
				fits++
				m.merge(bm) // members of a branch the value fits are known
			} else {
				misfits = append(misfits, be...)
			}
		}
		switch {
		case fits == 0:
			*errs = append(*errs, fmt.Errorf("%s: %s fits none of the %s branches: %w", at, describe(v), kw, errors.Join(misfits...)))
		case kw == "oneOf" && fits > 1:
			*errs = append(*errs, fmt.Errorf("%s: %s fits %d of the oneOf branches, want one", at, describe(v), fits))
		}
	}
	if t, ok := s["type"]; ok {
		var types []string
		if name, ok := t.(string); ok {
			types = []string{name}
		} else {
			for _, x := range list(t) {
				name, _ := x.(string)
				types = append(types, name)
			}
		}
		if !slices.ContainsFunc(types, func(name string) bool { return isType(v, name) }) {
			*errs = append(*errs, fmt.Errorf("%s: %s is not of type %v", at, describe(v), types))
			return
		}
	}
	if e, ok := s["enum"]; ok && !slices.ContainsFunc(list(e), func(x any) bool { return x == v }) {
		*errs = append(*errs, fmt.Errorf("%s: %s is not one of %v", at, describe(v), e))
	}
	switch x := v.(type) {
	case map[string]any:
		for _, r := range list(s["required"]) {
			name, _ := r.(string)
			if _, ok := x[name]; !ok {
				*errs = append(*errs, fmt.Errorf("%s: required field %q is missing", at, name))
			}
		}
		if props, ok := s["properties"]; ok {
			m.closed = true
			for _, name := range keys(obj(props)) {
				m.declare(name)
				if fv, ok := x[name]; ok {
					validate(obj(props)[name], fv, at+"."+name, errs)
				}
			}
		}
		switch ap := s["additionalProperties"].(type) {
		case bool:
			m.open = m.open || ap
			m.closed = m.closed || !ap
		case map[string]any:
			m.extra = append(m.extra, ap)
		}
	case []any:
		if items, ok := s["items"]; ok {
			for i, e := range x {
				validate(items, e, fmt.Sprintf("%s[%d]", at, i), errs)
			}
		}
	case float64:
		if lim, ok := s["minimum"].(float64); ok && x < lim {
			*errs = append(*errs, fmt.Errorf("%s: %v is below %v", at, x, lim))
		}
		if lim, ok := s["maximum"].(float64); ok && x > lim {
			*errs = append(*errs, fmt.Errorf("%s: %v is above %v", at, x, lim))
		}
	case string:
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339, x); err != nil {
				*errs = append(*errs, fmt.Errorf("%s: %q is not an RFC 3339 date-time", at, x))
			}
		}
	}
}

func isType(v any, name string) bool {
	switch name {
	case "null":
		return v == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f)
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	}
	return false
}

func describe(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 60 {
		return string(b[:60]) + "…"
	}
	return string(b)
}

// resolve follows $ref (within the document) until it reaches a value that is not one.
func resolve(v any) any {
	for range 32 {
		ref, ok := obj(v)["$ref"].(string)
		if !ok {
			return v
		}
		v = Lookup(ref)
	}
	return v
}

// Lookup returns what a "#/…" reference names in the document (nil when nothing).
func Lookup(ref string) any {
	pointer, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil
	}
	var v any = doc
	for _, part := range strings.Split(pointer, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		v = obj(v)[part]
	}
	return v
}

// Refs lists every $ref in the document.
func Refs() []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if r, ok := x["$ref"].(string); ok {
				out = append(out, r)
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
	return out
}

func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
