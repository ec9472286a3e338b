package catalog

import (
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/ids"
)

// Mount serves the catalog on the app's group (/v1).
func (s *Service) Mount(v1 *echo.Group) {
	v1.GET("/prices", s.getPrices)
}

// PricesAnswer is GET /v1/prices.
type PricesAnswer struct {
	Prices []PriceView `json:"prices"`
}

// maxLookupKey is Stripe's limit of a price's lookup key.
const maxLookupKey = 200

func checkLookupKey(k string) error {
	if k == "" || len(k) > maxLookupKey || !utf8.ValidString(k) {
		return apierr.New(apierr.CodeInvalidLookupKey, "a price's lookup key is 1 to %d characters of UTF-8", maxLookupKey)
	}
	for _, r := range k {
		if r < 0x20 || r == 0x7f {
			return apierr.New(apierr.CodeInvalidLookupKey, "a price's lookup key has no control characters")
		}
	}
	return nil
}

func (s *Service) getPrices(c echo.Context) error {
	var f Filter
	q := c.QueryParams()
	if v, ok := q["active"]; ok {
		switch v[0] {
		case "true":
			f.Active = new(bool)
			*f.Active = true
		case "false":
			f.Active = new(bool)
		default:
			return apierr.New(apierr.CodeInvalidActive, "active is true or false")
		}
	}
	if v, ok := q["product_id"]; ok {
		if err := ids.Check(v[0], "product_id", apierr.CodeInvalidRequest); err != nil {
			return err
		}
		f.ProductID = &v[0]
	}
	if v, ok := q["lookup_key"]; ok {
		if err := checkLookupKey(v[0]); err != nil {
			return err
		}
		f.LookupKey = &v[0]
	}
	a, err := s.pricesAnswer(c.Request().Context(), f)
	if err != nil {
		return database.APIError(err, "list the prices")
	}
	h := c.Response().Header()
	h.Add("Vary", "Accept-Encoding")
	if a.gzipped != nil && acceptsGzip(c.Request().Header.Get("Accept-Encoding")) {
		h.Set("Content-Encoding", "gzip")
		return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, a.gzipped)
	}
	return c.JSONBlob(http.StatusOK, a.body)
}

// acceptsGzip reads Accept-Encoding enough for the clients that send it (Go's transport, curl
// --compressed, browsers): gzip listed and not refused with q=0.
func acceptsGzip(h string) bool {
	for _, part := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

// answer is an encoded answer and, when it is worth it, its gzip: a catalog of a thousand prices
// is half a megabyte of JSON, and compressing it once per version instead of per request is what
// keeps a pricing page on every request cheap for the service and the app alike.
type answer struct {
	body, gzipped []byte
}

// minGzip is the size below which an answer is sent as it is.
const minGzip = 1400

func newAnswer(body []byte) (answer, error) {
	a := answer{body: body}
	if len(body) < minGzip {
		return a, nil
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return a, err
	}
	if _, err := zw.Write(body); err != nil {
		return a, err
	}
	if err := zw.Close(); err != nil {
		return a, err
	}
	a.gzipped = buf.Bytes()
	return a, nil
}

// pricesAnswer is the encoded answer of f: the copy made at the catalog's current version, or a
// new one. The version is read before the prices, so a copy is never labelled newer than what it
// holds: a write committed in between only makes the next request read again.
func (s *Service) pricesAnswer(ctx context.Context, f Filter) (answer, error) {
	var version int64
	err := s.db.WithContext(ctx).Statement.ConnPool.QueryRowContext(ctx,
		`SELECT version FROM catalog_versions WHERE livemode = $1`, s.livemode).Scan(&version)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return answer{}, fmt.Errorf("read the catalog version: %w", err)
	}
	key := f.key()
	if a, ok := s.answers.get(version, key); ok {
		return a, nil
	}
	prices, err := s.Prices(ctx, f)
	if err != nil {
		return answer{}, err
	}
	body, err := json.Marshal(PricesAnswer{Prices: prices})
	if err != nil {
		return answer{}, err
	}
	a, err := newAnswer(body)
	if err != nil {
		return answer{}, err
	}
	s.answers.put(version, key, a)
	return a, nil
}

func (f Filter) key() string {
	k := ""
	if f.Active != nil {
		k = strconv.FormatBool(*f.Active)
	}
	for _, v := range []*string{f.ProductID, f.LookupKey} {
		k += "\x00"
		if v != nil {
			k += "=" + *v
		}
	}
	return k
}

// maxCachedAnswers bounds the copies kept: a pricing page asks a handful of filters, a client
// cycling through many only costs reads.
const maxCachedAnswers = 256

// answerCache keeps the encoded answers of one catalog version.
type answerCache struct {
	mu      sync.Mutex
	version int64
	bodies  map[string]answer
}

func (c *answerCache) get(version int64, key string) (answer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != version {
		return answer{}, false
	}
	b, ok := c.bodies[key]
	return b, ok
}

func (c *answerCache) put(version int64, key string, a answer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != version || c.bodies == nil || len(c.bodies) >= maxCachedAnswers {
		c.version, c.bodies = version, map[string]answer{}
	}
	c.bodies[key] = a
}

// PriceOf is the price id a request names, by price_id or price_lookup_key (one of them, or
// neither when optional), checked against the catalog so that nothing Stripe would refuse is sent:
// an unknown lookup key is 422 unknown_price, an inactive price 422 inactive_price. A price_id the
// catalog does not know passes (the catalog fills from events and reconcile; Stripe decides).
// It answers "" when neither is given.
func (s *Service) PriceOf(ctx context.Context, priceID, lookupKey *string) (string, error) {
	switch {
	case priceID != nil && lookupKey != nil:
		return "", apierr.New(apierr.CodeInvalidRequest, "give price_id or price_lookup_key, not both")
	case lookupKey != nil:
		if err := checkLookupKey(*lookupKey); err != nil {
			return "", err
		}
		p, err := s.Resolve(ctx, *lookupKey)
		switch {
		case errors.Is(err, ErrUnknownPrice):
			return "", apierr.New(apierr.CodeUnknownPrice, "no price has the lookup key %q in this mode", *lookupKey).With("price_lookup_key", *lookupKey)
		case errors.Is(err, ErrInactivePrice):
			return "", apierr.New(apierr.CodeInactivePrice, "the price with lookup key %q (%s) is not sold any more", *lookupKey, p.PriceID).With("price_id", p.PriceID)
		case err != nil:
			return "", database.APIError(err, "resolve the price")
		}
		return p.PriceID, nil
	case priceID != nil:
		if err := ids.Check(*priceID, "price_id", apierr.CodeInvalidPriceID); err != nil {
			return "", err
		}
		p, err := s.Price(ctx, *priceID)
		switch {
		case errors.Is(err, ErrInactivePrice):
			return "", apierr.New(apierr.CodeInactivePrice, "price %s is not sold any more", p.PriceID).With("price_id", p.PriceID)
		case err != nil && !errors.Is(err, ErrUnknownPrice):
			return "", database.APIError(err, "resolve the price")
		}
		return *priceID, nil
	}
	return "", nil
}
