package billing

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The SQL that keeps a hold's start when an invoice fails again agrees with the Go rule the reads
// use, over every combination of what the rule looks at.
func TestHoldInForceIsPaymentHoldInForce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	t1, t2 := at(100), at(200)
	times := []*time.Time{nil, &t1, &t2}
	reasons := []*string{nil, ptr("subscription_create"), ptr("subscription_cycle")}
	statuses := []string{StatusActive, StatusTrialing, StatusPastDue, StatusUnpaid, StatusIncomplete, StatusIncompleteExpired, StatusCanceled}
	checked := 0
	for _, hold := range []bool{false, true} {
		for _, reason := range reasons {
			for _, status := range statuses {
				for _, subAt := range times {
					for _, invAt := range times {
						sub := Subscription{Status: status, PaymentHold: hold, PaymentHoldBillingReason: reason,
							SubEventCreated: subAt, InvEventCreated: invAt}
						var got bool
						err := e.db.WithContext(context.Background()).Raw(`SELECT coalesce((`+holdInForce+`), false)
							FROM (VALUES (CAST($1 AS boolean), CAST($2 AS text), CAST($3 AS text), CAST($4 AS timestamptz), CAST($5 AS timestamptz)))
							  AS v(payment_hold, payment_hold_billing_reason, status, sub_event_created, inv_event_created)`,
							hold, reason, status, subAt, invAt).Row().Scan(&got)
						if err != nil {
							t.Fatal(err)
						}
						if want := sub.paymentHoldInForce(); got != want {
							t.Errorf("%s: SQL says %v, Go %v", describe(sub), got, want)
						}
						checked++
					}
				}
			}
		}
	}
	if checked != 2*3*7*3*3 {
		t.Fatalf("checked %d cases", checked)
	}
}

func describe(s Subscription) string {
	return fmt.Sprintf("hold=%v reason=%s status=%s sub=%s inv=%s", s.PaymentHold, ptrStr(s.PaymentHoldBillingReason), s.Status,
		ptrTime(s.SubEventCreated), ptrTime(s.InvEventCreated))
}
