package customers

import (
	"net/http"
	"testing"
)

// A user linked (or being linked) in one mode is never relinked, updated or finished by a
// service running in the other: 409 livemode_conflict, no call to Stripe, the row untouched.
func TestPutRefusesALinkOfTheOtherMode(t *testing.T) {
	t.Parallel()
	for _, serviceLive := range []bool{false, true} {
		v := newEnv(t, serviceLive)
		v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('linked', 'cus_other', $1, $2)`, "a@example.com", !serviceLive)
		v.exec(`INSERT INTO customers (user_id, email, livemode) VALUES ('halfway', $1, $2)`, "h@example.com", !serviceLive)
		for _, user := range []string{"linked", "halfway"} {
			before := v.row(user)
			expectError(t, v.put(user, map[string]any{"email": "new@example.com", "name": "New"}), http.StatusConflict, "livemode_conflict")
			if after := v.row(user); after.Email != before.Email || after.Livemode != before.Livemode || after.StripeID() != before.StripeID() {
				t.Errorf("service live=%v, %s: row changed %+v → %+v", serviceLive, user, before, after)
			}
		}
		if n := len(v.proxy.Requests()); n != 0 {
			t.Errorf("service live=%v: %d calls reached Stripe", serviceLive, n)
		}
	}
}
