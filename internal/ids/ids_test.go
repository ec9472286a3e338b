package ids

import (
	"strings"
	"testing"

	"billing/internal/apierr"
)

func TestValid(t *testing.T) {
	for _, ok := range []string{"u", "user_1", "ORDER-2024-01", strings.Repeat("a", 100)} {
		if !Valid(ok) {
			t.Errorf("Valid(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", strings.Repeat("a", 101), "a b", "a/b", "../admin", "u'; DROP TABLE x;--", "<script>", "é", "a\x00", "a\n"} {
		if Valid(bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
}

func TestChecksAnswerTheirOwnCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code apierr.Code
	}{
		{CheckUser("a b"), apierr.CodeInvalidUserID},
		{CheckSubscription("a b"), apierr.CodeInvalidSubscriptionID},
		{Check("a b", "order_id", apierr.CodeInvalidOrderID), apierr.CodeInvalidOrderID},
	} {
		e, ok := apierr.As(tc.err)
		if !ok || e.Code != tc.code || e.Status() != 400 {
			t.Errorf("got %v, want a 400 %s", tc.err, tc.code)
		}
	}
	if err := CheckUser("ok"); err != nil {
		t.Errorf("CheckUser(ok) = %v", err)
	}
}
