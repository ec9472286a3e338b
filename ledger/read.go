package ledger

import (
	"context"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/appevents"
	"billing/internal/apierr"
	"billing/internal/database"
)

// chargeView is GET /v1/charges/{order_id}: the fields POST /v1/charges answers, with the status
// as it is now (settled by events, or finished by the service itself), and what else the row
// knows. A row still pending reads "pending" with no PaymentIntent yet. amount_refunded is
// refundedSQL. It is also the data of the app event charge.updated (tellCharge).
type chargeView struct {
	OrderID         string  `json:"order_id" gorm:"column:order_id"`
	Status          string  `json:"status" gorm:"column:status"`
	PaymentIntentID *string `json:"payment_intent_id" gorm:"column:payment_intent_id"`
	Amount          int64   `json:"amount" gorm:"column:amount"`
	Currency        string  `json:"currency" gorm:"column:currency"`
	IdempotencyKey  string  `json:"idempotency_key" gorm:"column:idempotency_key"`
	DeclineCode     *string `json:"decline_code" gorm:"column:decline_code"`
	AmountRefunded  int64   `json:"amount_refunded" gorm:"column:amount_refunded"`
	Livemode        bool    `json:"livemode" gorm:"column:livemode"`
}

// chargeViewSQL reads the chargeView of the order $1: the one query behind GET and the app
// event, so that what the app is told is exactly what it would read.
const chargeViewSQL = `
	SELECT c.order_id, coalesce(c.status, 'pending') AS status, c.payment_intent_id, c.amount, c.currency, c.idempotency_key,
	  c.decline_code, ` + refundedSQL + ` AS amount_refunded, c.livemode
	FROM charges c WHERE c.order_id = $1 /* all modes: one per database; the caller refuses or skips a row of the other */`

// readChargeView reads an order's chargeView on db (the pool, or a transaction); nil when the
// order has no charge. The row may be of either mode: the caller checks Livemode.
func readChargeView(ctx context.Context, db *gorm.DB, orderID string) (*chargeView, error) {
	var rows []chargeView
	if err := db.WithContext(ctx).Raw(chargeViewSQL, orderID).Scan(&rows).Error; err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

func (s *Service) getCharge(c echo.Context) error {
	orderID := c.Param("order_id")
	if err := checkID(orderID, "order_id", apierr.CodeInvalidOrderID); err != nil {
		return err
	}
	view, err := readChargeView(c.Request().Context(), s.db, orderID)
	if err != nil {
		return database.APIError(err, "load charge")
	}
	if view == nil {
		return apierr.New(apierr.CodeNotFound, "no charge for order %s", orderID).With("order_id", orderID)
	}
	if view.Livemode != s.livemode {
		return modeConflict("order "+orderID, view.Livemode)
	}
	return c.JSON(http.StatusOK, view)
}

// tellCharge tells the app, in tx, the charge of an order as GET /v1/charges/{order_id} answers
// it once tx commits (charge.updated), when that differs from what was last told about it; a
// first answer is news. Every write that can change the view calls it in its own transaction,
// after the write and after every row lock of the ledger it takes (the user's lock comes last:
// charge, then refunds, then the user, on every path). livemode is the row's: only the
// deployment's own mode is told. userID is the charge's user when the caller has it, "" to look
// it up.
func (s *Service) tellCharge(ctx context.Context, tx *gorm.DB, orderID, userID string, livemode bool) error {
	if s.teller == nil || livemode != s.livemode {
		return nil
	}
	if userID == "" {
		var users []string
		if err := tx.WithContext(ctx).Raw(`SELECT user_id FROM charges WHERE order_id = $1 AND livemode = $2`,
			orderID, s.livemode).Scan(&users).Error; err != nil {
			return fmt.Errorf("tell charge %s: load user: %w", orderID, err)
		}
		if len(users) == 0 {
			return nil
		}
		userID = users[0]
	}
	l, err := s.teller.Lock(ctx, tx, userID, s.livemode, appevents.ChargeSubject(orderID))
	if err != nil {
		return fmt.Errorf("tell charge %s: %w", orderID, err)
	}
	view, err := readChargeView(ctx, tx, orderID)
	if err != nil {
		return fmt.Errorf("tell charge %s: %w", orderID, err)
	}
	if view == nil || view.Livemode != s.livemode {
		return nil
	}
	if _, err := s.teller.Tell(ctx, tx, l, appevents.Change{Type: appevents.TypeChargeUpdated, Answer: view}); err != nil {
		return fmt.Errorf("tell charge %s: %w", orderID, err)
	}
	return nil
}
