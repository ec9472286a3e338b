package billing

import (
	"encoding/json"
)

// ReplayRank is the rank (the middle of the ordering key: created, rank, id) that the handlers
// store for an event of eventType with data.object obj: `billing verify` replays the log in the
// guards' own order. Types outside billing's column groups rank 0; an object that does not decode
// ranks 0 too (its handler refuses it anyway).
func ReplayRank(eventType string, obj json.RawMessage) int {
	switch eventType {
	case EventSubscriptionCreated, EventSubscriptionUpdated, EventSubscriptionDeleted,
		EventSubscriptionTrialWillEnd, EventSubscriptionPaused, EventSubscriptionResumed:
		sub, err := decodeSubscription(obj)
		if err != nil {
			return 0
		}
		status := sub.Status
		if eventType == EventSubscriptionDeleted && !IsTerminal(status) {
			status = StatusCanceled
		}
		return subEventRank(eventType, status)
	}
	if invoiceEffectOf(eventType) != invoiceRecordOnly {
		return invEventRank(eventType)
	}
	return 0
}

// SnapshotRank is the rank a read of Stripe applies with: below every event's.
const SnapshotRank = snapshotRank
