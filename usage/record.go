package usage

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"billing/customers"
	"billing/entitlements"
	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
)

// post serves POST /v1/customers/{user_id}/usage: 202 with the new record once it is committed;
// 200 with the same record for a repeat (its status says where it is now); 409 for the same
// usage_id with another meter, value or timestamp.
func (s *Service) post(c echo.Context) error {
	userID := c.Param("user_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	var raw usageRequestJSON
	if err := httpserver.DecodeJSON(c, &raw, false); err != nil {
		return err
	}
	req, err := parseRequest(raw, userID)
	if err != nil {
		s.metrics.requests.WithLabelValues(outcomeOf(err)).Inc()
		return err
	}
	// Once the row may be in, the answer is written even if the client has gone.
	ctx := context.WithoutCancel(c.Request().Context())
	rec, created, err := s.store(ctx, userID, req)
	if err != nil {
		s.metrics.requests.WithLabelValues(outcomeOf(err)).Inc()
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusAccepted
		s.metrics.requests.WithLabelValues("accepted").Inc()
		s.rep.nudge()
	} else {
		s.metrics.requests.WithLabelValues("repeat").Inc()
	}
	return c.JSON(status, rec.answer())
}

func outcomeOf(err error) string {
	if e, ok := apierr.As(err); ok {
		return string(e.Code)
	}
	return string(apierr.CodeInternal)
}

// store inserts the record, or finds the one already there; created says which.
func (s *Service) store(ctx context.Context, userID string, req usageRequest) (*record, bool, error) {
	if rec, err := s.load(ctx, userID, req.UsageID); err != nil || rec != nil {
		if err != nil {
			return nil, false, err
		}
		return rec, false, sameRecord(rec, req)
	}
	now := s.now().UTC()
	at := now.Truncate(time.Second)
	if req.Timestamp != nil {
		at = *req.Timestamp
		if err := checkTimestamp(at, now); err != nil {
			return nil, false, err
		}
	}
	cust, err := customers.Get(ctx, s.db, userID, s.livemode)
	switch {
	case errors.Is(err, customers.ErrNotFound):
		return nil, false, apierr.New(apierr.CodeNoCustomer,
			"user %s has no Stripe customer; PUT /v1/customers/%s first", userID, userID).With("user_id", userID)
	case err != nil:
		if _, ok := apierr.As(err); ok {
			return nil, false, err // the user is linked in the other mode
		}
		return nil, false, database.APIError(err, "load customer")
	}
	identifier := Identifier(userID, req.UsageID)
	// The conflict target is left open: the row may collide on its key (a concurrent repeat)
	// or on its identifier (another user's ids that spell the same one).
	res := s.db.WithContext(ctx).Exec(`
		INSERT INTO usage_records (livemode, user_id, usage_id, meter, value, occurred_at, stripe_customer_id,
			identifier, status, next_attempt_at, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $10)
		ON CONFLICT DO NOTHING`,
		s.livemode, userID, req.UsageID, req.Meter, req.Value, at, cust.StripeID(), identifier, statePending, now)
	if res.Error != nil {
		return nil, false, database.APIError(res.Error, "store usage record")
	}
	rec, err := s.load(ctx, userID, req.UsageID)
	if err != nil {
		return nil, false, err
	}
	if rec == nil {
		// Nothing under our key, so the identifier is taken: by another user's usage.
		return nil, false, apierr.New(apierr.CodeIdempotencyConflict,
			"the meter event identifier %s is already another user's usage record; use another usage_id", identifier).
			With("usage_id", req.UsageID).With("identifier", identifier)
	}
	if res.RowsAffected == 1 {
		s.log.DebugContext(ctx, "usage recorded", "user_id", userID, "usage_id", req.UsageID, "meter", req.Meter)
		return rec, true, nil
	}
	// A concurrent request stored it first: a repeat, or a conflict.
	return rec, false, sameRecord(rec, req)
}

func (s *Service) load(ctx context.Context, userID, usageID string) (*record, error) {
	var rows []record
	if err := s.db.WithContext(ctx).Raw(`SELECT * FROM usage_records WHERE livemode = $1 AND user_id = $2 AND usage_id = $3`,
		s.livemode, userID, usageID).Scan(&rows).Error; err != nil {
		return nil, database.APIError(err, "load usage record")
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// sameRecord accepts a repeat of the stored record: the same meter and value, and the same
// timestamp when the repeat gives one (one left out is the stored one).
func sameRecord(rec *record, req usageRequest) error {
	var diff []string
	if rec.Meter != req.Meter {
		diff = append(diff, "meter")
	}
	if rec.Value != req.Value {
		diff = append(diff, "value")
	}
	if req.Timestamp != nil && !rec.OccurredAt.Equal(*req.Timestamp) {
		diff = append(diff, "timestamp")
	}
	if len(diff) == 0 {
		return nil
	}
	return apierr.New(apierr.CodeIdempotencyConflict,
		"usage_id %s was already recorded with another %s; use a new usage_id for other usage", rec.UsageID, strings.Join(diff, ", ")).
		With("usage_id", rec.UsageID)
}

// summary is the answer of GET /v1/customers/{user_id}/usage.
type summary struct {
	UserID      string     `json:"user_id"`
	Meter       string     `json:"meter"`
	PeriodStart *time.Time `json:"period_start"`
	PeriodEnd   *time.Time `json:"period_end"`
	// Total is every record of the period that Stripe did not refuse; Pending the part of it
	// that Stripe has not acknowledged yet (pending, or waiting for an operator's review).
	Total   int64 `json:"total"`
	Pending int64 `json:"pending"`
}

// get serves GET /v1/customers/{user_id}/usage?meter=: the sums of the user's usage of the
// meter in the current period of their subscription, from local state. A user without a
// subscription has no period: the sums are then over all their records of the meter.
func (s *Service) get(c echo.Context) error {
	userID := c.Param("user_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	meter := c.QueryParam("meter")
	if meter == "" {
		return apierr.New(apierr.CodeInvalidMeter, "the meter query parameter is required")
	}
	if err := checkMeter(meter); err != nil {
		return err
	}
	ctx := c.Request().Context()
	sum, err := s.Summary(ctx, userID, meter)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, sum)
}

// Summary sums a user's usage of a meter in their subscription's current period.
func (s *Service) Summary(ctx context.Context, userID, meter string) (*summary, error) {
	view, err := s.periods.Customer(ctx, userID)
	switch {
	case errors.Is(err, entitlements.ErrNoCustomer):
		return nil, apierr.New(apierr.CodeNotFound, "no customer for user %s", userID).With("user_id", userID)
	case err != nil:
		if _, ok := apierr.As(err); ok {
			return nil, err
		}
		return nil, database.APIError(err, "load customer")
	}
	sum := &summary{UserID: userID, Meter: meter}
	if id := view.Entitlement.SubscriptionID; id != nil {
		for _, sub := range view.Subscriptions {
			if sub.SubscriptionID == *id && sub.CurrentPeriodStart != nil && sub.CurrentPeriodEnd != nil {
				start, end := sub.CurrentPeriodStart.UTC(), sub.CurrentPeriodEnd.UTC()
				sum.PeriodStart, sum.PeriodEnd = &start, &end
			}
		}
	}
	var period *Period
	if sum.PeriodStart != nil {
		period = &Period{Start: *sum.PeriodStart, End: *sum.PeriodEnd}
	}
	totals, err := s.totals(ctx, userID, s.livemode, meter, period)
	if err != nil {
		return nil, database.APIError(err, "sum usage")
	}
	for _, t := range totals {
		sum.Total, sum.Pending = t.Total, t.Pending
	}
	return sum, nil
}

// Period is a half-open span [Start, End) of usage, a subscription's current period.
type Period struct{ Start, End time.Time }

// MeterTotal is one meter's usage over a period: Total is what Stripe did not refuse, Pending
// the part of it not acknowledged yet (NeedsReview of that waits for an operator), Refused what
// Stripe refused (kept out of Total).
type MeterTotal struct {
	Meter                                string
	Total, Pending, NeedsReview, Refused int64
	Records                              int64
}

// MeterTotals sums a user's usage per meter of one mode over the period (every record when
// period is nil), meters by name. The console shows both modes' worlds, hence the mode argument.
func (s *Service) MeterTotals(ctx context.Context, userID string, livemode bool, period *Period) ([]MeterTotal, error) {
	totals, err := s.totals(ctx, userID, livemode, "", period)
	if err != nil {
		return nil, fmt.Errorf("sum usage of %s: %w", userID, err)
	}
	return totals, nil
}

// totals is the one query behind the usage sums: per meter, or of one meter when meter is set.
func (s *Service) totals(ctx context.Context, userID string, livemode bool, meter string, period *Period) ([]MeterTotal, error) {
	from, to := time.Unix(0, 0).UTC(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if period != nil {
		from, to = period.Start, period.End
	}
	var rows []MeterTotal
	err := s.db.WithContext(ctx).Raw(`
		SELECT meter,
			coalesce(sum(value) FILTER (WHERE status <> $1), 0) AS total,
			coalesce(sum(value) FILTER (WHERE status IN ($2, $3)), 0) AS pending,
			coalesce(sum(value) FILTER (WHERE status = $3), 0) AS needs_review,
			coalesce(sum(value) FILTER (WHERE status = $1), 0) AS refused,
			count(*) AS records
		FROM usage_records
		WHERE livemode = $4 AND user_id = $5 AND ($6 = '' OR meter = $6) AND occurred_at >= $7 AND occurred_at < $8
		GROUP BY meter ORDER BY meter`,
		stateRefused, statePending, stateNeedsReview, livemode, userID, meter, from, to).Scan(&rows).Error
	return rows, err
}

// recordKey names one row.
type recordKey struct {
	UserID  string `gorm:"column:user_id"`
	UsageID string `gorm:"column:usage_id"`
}
