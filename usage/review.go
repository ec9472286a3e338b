package usage

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/audit"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
)

// The operator's side of the window rule (see the package doc): the records that wait for a
// decision, and the decision. Stripe cannot be asked whether it holds a meter event by its
// identifier, so an operator looks at the customer's meter event summaries and says either
// "reported" (Stripe has it: mark it, never send it) or "resend" (Stripe does not: send it again,
// under a fresh window counted from the new first attempt).

// MountAdmin adds the review routes to the /admin group.
func (s *Service) MountAdmin(admin *echo.Group) {
	admin.GET("/usage/review", s.listReview)
	admin.POST("/usage/review/:user_id/:usage_id", s.decide)
}

// reviewItem is a record waiting for a decision.
type reviewItem struct {
	answer
	UserID           string     `json:"user_id"`
	StripeCustomerID string     `json:"stripe_customer_id"`
	Attempts         int        `json:"attempts"`
	FirstAttemptAt   *time.Time `json:"first_attempt_at"`
	LastAttemptAt    *time.Time `json:"last_attempt_at"`
	ErrorCode        *string    `json:"error_code"`
	ReviewSince      *time.Time `json:"review_since"`
}

func (r *record) reviewItem() reviewItem {
	return reviewItem{answer: r.answer(), UserID: r.UserID, StripeCustomerID: r.StripeCustomerID, Attempts: r.Attempts,
		FirstAttemptAt: r.FirstAttemptAt, LastAttemptAt: r.LastAttemptAt, ErrorCode: r.ErrorCode, ReviewSince: r.ReviewSince}
}

// listReview serves GET /admin/usage/review: the mode's needs_review records, oldest first.
func (s *Service) listReview(c echo.Context) error {
	var rows []record
	if err := s.db.WithContext(c.Request().Context()).Raw(`SELECT * FROM usage_records
		WHERE livemode = $1 AND status = $2 ORDER BY review_since, user_id, usage_id LIMIT 500`,
		s.livemode, stateNeedsReview).Scan(&rows).Error; err != nil {
		return database.APIError(err, "list usage records for review")
	}
	items := make([]reviewItem, 0, len(rows))
	for i := range rows {
		items = append(items, rows[i].reviewItem())
	}
	return c.JSON(http.StatusOK, map[string]any{"records": items})
}

// decide serves POST /admin/usage/review/{user_id}/{usage_id} {"decision": "reported"|"resend"}.
func (s *Service) decide(c echo.Context) error {
	userID, usageID := c.Param("user_id"), c.Param("usage_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	if err := ids.Check(usageID, "usage_id", apierr.CodeInvalidUsageID); err != nil {
		return err
	}
	var body struct {
		Decision json.RawMessage `json:"decision"`
	}
	if err := httpserver.DecodeJSON(c, &body, false); err != nil {
		return err
	}
	var decision string
	if json.Unmarshal(body.Decision, &decision) != nil || (decision != "reported" && decision != "resend") {
		return apierr.New(apierr.CodeInvalidRequest, `decision must be "reported" (Stripe holds the event) or "resend" (it does not)`)
	}
	ctx := c.Request().Context()
	now := s.now().UTC()
	set := `status = $1, reported_at = $2, error_message = 'marked reported by an operator', updated_at = $2`
	if decision == "resend" {
		set = `status = $1, first_attempt_at = NULL, review_since = NULL, next_attempt_at = $2, updated_at = $2`
	}
	next := stateReported
	if decision == "resend" {
		next = statePending
	}
	target := Identifier(userID, usageID)
	var rec *record
	var decided bool
	// The decision and its audit entry commit together; a refused one is recorded alone.
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec(fmt.Sprintf(`UPDATE usage_records SET %s
			WHERE livemode = $3 AND user_id = $4 AND usage_id = $5 AND status = $6`, set),
			next, now, s.livemode, userID, usageID, stateNeedsReview)
		if res.Error != nil {
			return res.Error
		}
		decided = res.RowsAffected == 1
		var rows []record
		if err := tx.Raw(`SELECT * FROM usage_records WHERE livemode = $1 AND user_id = $2 AND usage_id = $3`,
			s.livemode, userID, usageID).Scan(&rows).Error; err != nil {
			return err
		}
		result := decision
		switch {
		case len(rows) == 0:
			result = "refused: no such usage record"
		case !decided:
			rec = &rows[0]
			result = "refused: the record is " + rec.Status + ", not needs_review"
		default:
			rec = &rows[0]
		}
		return audit.Record(ctx, tx, audit.ActionUsageReview, target, s.livemode, result)
	})
	if err != nil {
		return database.APIError(err, "decide usage record")
	}
	if rec == nil {
		return apierr.New(apierr.CodeNotFound, "no usage record %s of user %s", usageID, userID)
	}
	if !decided {
		return apierr.New(apierr.CodeConflict, "usage record %s of user %s is %s, not needs_review", usageID, userID, rec.Status)
	}
	s.log.WarnContext(ctx, "usage record decided by an operator", "user_id", userID, "usage_id", usageID, "decision", decision)
	if decision == "resend" {
		s.rep.nudge()
	}
	return c.JSON(http.StatusOK, rec.reviewItem())
}
