package testenv

import (
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
)

// Base is an arbitrary instant (2024-06-01T00:00:00Z) that tests count event times from, so
// that their expectations are fixed dates rather than the day's.
const Base int64 = 1717200000

// At is the instant sec seconds after Base, in UTC.
func At(sec int64) time.Time { return time.Unix(Base+sec, 0).UTC() }

// Clock is a settable clock for the code under test (pass its Now where the code takes one). It
// is safe for concurrent use: the test moves it while the service's goroutines read it.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock is a clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

// Exec runs a statement on db and stops the test if it fails: for fixtures, where a failure is
// the test's own mistake.
func Exec(t testing.TB, db *gorm.DB, sql string, args ...any) {
	t.Helper()
	if err := db.Exec(sql, args...).Error; err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// LinkCustomer stores the customers row that links userID to the Stripe customer customerID in
// one mode (livemode), as PUT /v1/customers does, without Stripe. A user already linked in that
// mode stops the test: a fixture that links twice is a mistake, not a re-link.
func LinkCustomer(t testing.TB, db *gorm.DB, userID, customerID, email string, livemode bool) {
	t.Helper()
	if err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ($1, $2, $3, $4)`,
		userID, customerID, email, livemode).Error; err != nil {
		t.Fatalf("link %s to %s: %v", userID, customerID, err)
	}
}
