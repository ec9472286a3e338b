package ledger

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
)

// chargeView is GET /v1/charges/{order_id}: the fields POST /v1/charges answers, with the status
// as it is now (settled by events, or finished by the service itself), and what else the row
// knows. A row still pending reads "pending" with no PaymentIntent yet. amount_refunded is
// refundedSQL.
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

func (s *Service) getCharge(c echo.Context) error {
	orderID := c.Param("order_id")
	if err := checkID(orderID, "order_id", apierr.CodeInvalidOrderID); err != nil {
		return err
	}
	var rows []chargeView
	err := s.db.WithContext(c.Request().Context()).Raw(`
		SELECT c.order_id, coalesce(c.status, 'pending') AS status, c.payment_intent_id, c.amount, c.currency, c.idempotency_key,
		  c.decline_code, `+refundedSQL+` AS amount_refunded, c.livemode
		FROM charges c WHERE c.order_id = $1 /* all modes: one per database; refused below when of the other */`, orderID).Scan(&rows).Error
	if err != nil {
		return database.APIError(err, "load charge")
	}
	if len(rows) == 0 {
		return apierr.New(apierr.CodeNotFound, "no charge for order %s", orderID).With("order_id", orderID)
	}
	if rows[0].Livemode != s.livemode {
		return modeConflict("order "+orderID, rows[0].Livemode)
	}
	return c.JSON(http.StatusOK, rows[0])
}
