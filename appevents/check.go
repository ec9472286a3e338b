package appevents

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"gorm.io/gorm"
)

// Answerer gives a user's entitlement answer as the app reads it now (JSON).
type Answerer func(ctx context.Context, userID string) (json.RawMessage, error)

// Untold is a user whose entitlement answer now is not the one last told.
type Untold struct {
	UserID string
	// Told is the answer last told ("" when none was: the none answer counts).
	Told string
	Now  string
	// Due says time alone changed it and the sweeper's moment has come (within Grace): news
	// on its way rather than news lost.
	Due bool
}

// CheckReport is what Check found.
type CheckReport struct {
	Users  int
	Untold []Untold
	// Gaps are users whose stored sequences are not 1…last without a hole.
	Gaps []string
}

// CheckGrace is how long past its planned moment a time-driven change may still be untold: the
// sweep's interval and its run.
const CheckGrace = time.Minute

// Check proves, on the live tables, that every change has its event: each linked user's answer
// now is the one last told, and each user's sequences have no gap. now is the policy's clock.
func Check(ctx context.Context, db *gorm.DB, livemode bool, now time.Time, answer Answerer, baseline func(string) json.RawMessage) (*CheckReport, error) {
	var users []struct {
		UserID string     `gorm:"column:user_id"`
		Told   []byte     `gorm:"column:answer"`
		Next   *time.Time `gorm:"column:next_change_at"`
	}
	if err := db.WithContext(ctx).Raw(`SELECT c.user_id, a.answer, u.next_change_at
		FROM customers c
		LEFT JOIN app_event_users u ON u.user_id = c.user_id AND u.livemode = c.livemode
		LEFT JOIN app_event_answers a ON a.user_id = c.user_id AND a.livemode = c.livemode AND a.subject = 'entitlement'
		WHERE c.livemode = $1 AND c.stripe_customer_id IS NOT NULL ORDER BY c.user_id`, livemode).Scan(&users).Error; err != nil {
		return nil, fmt.Errorf("app events: check: %w", err)
	}
	r := &CheckReport{Users: len(users)}
	for _, u := range users {
		cur, err := answer(ctx, u.UserID)
		if err != nil {
			return nil, err
		}
		told := json.RawMessage(u.Told)
		if told == nil {
			told = baseline(u.UserID)
		}
		_, changed, err := diff(told, cur)
		if err != nil {
			return nil, fmt.Errorf("app events: check user %s: %w", u.UserID, err)
		}
		if !changed {
			continue
		}
		r.Untold = append(r.Untold, Untold{UserID: u.UserID, Told: string(u.Told), Now: string(cur),
			Due: u.Next != nil && !u.Next.After(now) && now.Sub(*u.Next) < CheckGrace})
	}
	var gaps []string
	if err := db.WithContext(ctx).Raw(`SELECT u.user_id FROM app_event_users u
		LEFT JOIN (SELECT user_id, count(*) AS n, max(sequence) AS last FROM app_events WHERE livemode = $1 GROUP BY user_id) e
		  ON e.user_id = u.user_id
		WHERE u.livemode = $1 AND (coalesce(e.n, 0) <> u.last_sequence OR coalesce(e.last, 0) <> u.last_sequence)`, livemode).
		Scan(&gaps).Error; err != nil {
		return nil, fmt.Errorf("app events: check sequences: %w", err)
	}
	sort.Strings(gaps)
	r.Gaps = gaps
	return r, nil
}
