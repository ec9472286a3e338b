package billing

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/ids"
)

// MountAPI adds, on the /v1 group (app-token auth applied by main):
//
//	GET /customers/:user_id/entitlement  → Entitlement
//	GET /customers/:user_id/invoices     → InvoicePage (?limit=&starting_after=)
//
// GET /customers/:user_id (the link with its subscriptions) is the customers package's.
func (s *Service) MountAPI(v1 *echo.Group) {
	v1.GET("/customers/:user_id/entitlement", s.getEntitlement)
	v1.GET("/customers/:user_id/invoices", s.getInvoices)
}

// userIDParam validates the user id like PUT /v1/customers/{user_id} does (400 invalid_user_id).
func userIDParam(c echo.Context) (string, error) {
	id := c.Param("user_id")
	if err := ids.CheckUser(id); err != nil {
		return "", err
	}
	return id, nil
}

func (s *Service) getEntitlement(c echo.Context) error {
	userID, err := userIDParam(c)
	if err != nil {
		return err
	}
	e, err := s.Entitlement(c.Request().Context(), userID)
	if err != nil {
		return readError(err, userID)
	}
	return c.JSON(http.StatusOK, e)
}

// readError answers a failed read: 404 for an unknown user, 503 when the database is down.
func readError(err error, userID string) error {
	if errors.Is(err, ErrNoCustomer) {
		return apierr.New(apierr.CodeNotFound, "no customer for user %q", userID)
	}
	return database.APIError(err, "load customer "+userID)
}
