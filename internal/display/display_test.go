package display

import (
	"fmt"
	"testing"
)

func TestAmount(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	tests := []struct {
		amount   *int64
		currency string
		want     string
	}{
		{n(2000), "usd", "20.00 USD"},
		{n(5), "eur", "0.05 EUR"},
		{n(0), "usd", "0.00 USD"},
		{n(-150), "usd", "-1.50 USD"},
		{n(1500), "jpy", "1500 JPY"},
		{n(1234), "kwd", "1.234 KWD"},
		{n(7), "", "0.07"},
		{nil, "usd", ""},
	}
	for _, tc := range tests {
		if got := Amount(tc.amount, tc.currency); got != tc.want {
			amount := "<nil>"
			if tc.amount != nil {
				amount = fmt.Sprint(*tc.amount)
			}
			t.Errorf("Amount(%s, %q) = %q, want %q", amount, tc.currency, got, tc.want)
		}
	}
}
