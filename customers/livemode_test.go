package customers

import (
	"net/http"
	"testing"
)

// A user linked (or being linked) in one mode is a stranger to a service running in the other:
// its PUT makes the user's link of its own world (201), and the other world's row is neither
// relinked, updated nor finished, nor does it lock the user out of paying in this one.
func TestPutLinksInItsOwnWorld(t *testing.T) {
	t.Parallel()
	for _, serviceLive := range []bool{false, true} {
		v := newEnv(t, serviceLive)
		v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('linked', 'cus_other', $1, $2)`, "a@example.com", !serviceLive)
		v.exec(`INSERT INTO customers (user_id, email, livemode) VALUES ('halfway', $1, $2)`, "h@example.com", !serviceLive)
		for _, user := range []string{"linked", "halfway"} {
			before := v.rowIn(user, !serviceLive)
			rec := v.put(user, map[string]any{"email": "new@example.com", "name": "New"})
			if rec.Code != http.StatusCreated {
				t.Fatalf("service live=%v, %s: %d %s, want 201", serviceLive, user, rec.Code, rec.Body)
			}
			if after := v.rowIn(user, !serviceLive); after.StripeID() != before.StripeID() || after.Email != before.Email || !after.UpdatedAt.Equal(before.UpdatedAt) {
				t.Errorf("service live=%v, %s: the other world's row changed %+v → %+v", serviceLive, user, before, after)
			}
			if own := v.rowIn(user, serviceLive); own.StripeID() == "" || own.StripeID() == "cus_other" || own.Email != "new@example.com" {
				t.Errorf("service live=%v, %s: own link %+v", serviceLive, user, own)
			}
		}
	}
}
