package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"gorm.io/gorm"

	"billing/webhooks"
)

// status_since is when the current status began. Events of one status may arrive in any order,
// so it is kept as the oldest event seen of the current stint of that status:
//
//   - a newer event of the same status leaves it alone (the status did not begin then);
//   - an older event of the same status moves it earlier, unless it lies at or before
//     status_other_at, the newest time the subscription is known to have had another status
//     (that event belongs to an earlier stint);
//   - an event that says the status began with it (customer.subscription.created, or an update
//     whose previous_attributes name another status) sets both to its own time.

// statusBeganWith reports whether ev says that the subscription entered status with it.
func statusBeganWith(ev webhooks.Event, status string) bool {
	if ev.Type == EventSubscriptionCreated {
		return true
	}
	raw := bytes.TrimSpace(ev.PreviousAttributes)
	if len(raw) == 0 || raw[0] != '{' {
		return false
	}
	var prev struct {
		Status *string `json:"status"`
	}
	if json.Unmarshal(raw, &prev) != nil || prev.Status == nil {
		return false
	}
	return *prev.Status != status
}

// applyStaleStatus records what an event older than the stored snapshot says about the current
// status's start (see above); the snapshot itself is not touched.
func (s *Service) applyStaleStatus(ctx context.Context, tx *gorm.DB, ev webhooks.Event, subscriptionID, status string) error {
	err := tx.WithContext(ctx).Exec(`
		UPDATE subscriptions SET
		  status_since = CASE WHEN status = $3 AND status_since > $4 AND (status_other_at IS NULL OR status_other_at < $4)
		                      THEN CAST($4 AS timestamptz) ELSE status_since END,
		  status_other_at = CASE
		    WHEN status <> $3 AND $4 < status_since THEN GREATEST(status_other_at, CAST($4 AS timestamptz))
		    WHEN status = $3 AND $5 AND status_since > $4 AND (status_other_at IS NULL OR status_other_at < $4)
		      THEN CAST($4 AS timestamptz)
		    ELSE status_other_at END
		WHERE subscription_id = $1 AND livemode = $2 AND sub_event_created IS NOT NULL AND status_since IS NOT NULL`,
		subscriptionID, ev.Livemode, status, ev.Created.UTC(), statusBeganWith(ev, status)).Error
	if err != nil {
		return fmt.Errorf("apply the status of stale %s %s to %s: %w", ev.Type, ev.ID, subscriptionID, err)
	}
	return nil
}
