package billing

import (
	"cmp"
	"slices"
	"time"

	"billing/webhooks"
)

// Timeline outcomes: what an event did to the subscription it names.
const (
	OutcomeCurrent         = "current"          // applied, and its state is the stored one
	OutcomeSuperseded      = "superseded"       // applied when processed, replaced since by a newer event
	OutcomeSkippedOlder    = "skipped_older"    // the ordering guard kept a newer state
	OutcomeSkippedTerminal = "skipped_terminal" // the subscription had already ended
	OutcomeNotApplied      = "not_applied"      // newer than the stored state, yet not applied (see the words)
	OutcomeWaiting         = "waiting"
	OutcomeFailed          = "failed"
	OutcomeIgnored         = "ignored"
	OutcomeOther           = "other" // processed, of a type that sets neither column group
)

// TimelineEntry is one event naming a subscription and what it did to it.
type TimelineEntry struct {
	Event webhooks.LoggedEvent
	// Group is the column group the event's type writes: "subscription", "payment", or "".
	Group string
	// Status is the subscription status a subscription event carried ("" for others).
	Status  string
	Outcome string
	Words   string
}

// orderKey is the ordering guard's key: (created, rank, event id), compared as the guard does.
type orderKey struct {
	created time.Time
	rank    int
	id      string
}

func (k orderKey) compare(o orderKey) int {
	if c := k.created.Compare(o.created); c != 0 {
		return c
	}
	if c := cmp.Compare(k.rank, o.rank); c != 0 {
		return c
	}
	return cmp.Compare(k.id, o.id) // byte-wise, as COLLATE "C"
}

// ExplainTimeline says, for each event naming the subscription (oldest first), whether it set
// the state stored now, was applied and replaced since, or was skipped, and why.
//
// Events are replayed in the order they were processed (processed_at: each event's mark is the
// last write of its transaction, so it orders the applies of one subscription), keeping the
// newest key of each column group as the guard does. The stored keys settle the events whose
// state is current. Reads from Stripe (reconcile, re-reads) write the same keys without being
// events; where one decided the state, the words of the events around it can only be as exact
// as the log they come from.
func ExplainTimeline(st *SubscriptionState, events []webhooks.LoggedEvent) []TimelineEntry {
	entries := make([]TimelineEntry, len(events))
	keys := make([]*orderKey, len(events))
	for i, ev := range events {
		e := TimelineEntry{Event: ev}
		switch ev.Type {
		case EventSubscriptionCreated, EventSubscriptionUpdated, EventSubscriptionDeleted, EventSubscriptionTrialWillEnd:
			e.Group = "subscription"
			if obj, err := decodeSubscription(ev.Object); err == nil {
				e.Status = obj.Status
				if ev.Type == EventSubscriptionDeleted && !IsTerminal(e.Status) {
					e.Status = StatusCanceled
				}
			}
			if ev.EventCreated != nil {
				keys[i] = &orderKey{ev.EventCreated.UTC(), subEventRank(ev.Type, e.Status), ev.EventID}
			}
		case EventInvoicePaymentFailed, EventInvoicePaymentSucceeded:
			e.Group = "payment"
			if ev.EventCreated != nil {
				keys[i] = &orderKey{ev.EventCreated.UTC(), invEventRank(ev.Type), ev.EventID}
			}
		}
		switch ev.Status {
		case "received":
			e.Outcome, e.Words = OutcomeWaiting, "Waiting to be processed; nothing it carries is applied yet."
		case "failed":
			e.Outcome, e.Words = OutcomeFailed, "Failed and dead-lettered: nothing it carries was applied. Replay it once the cause is fixed."
		case "ignored":
			e.Outcome, e.Words = OutcomeIgnored, "Ignored: the service handles no event of this type."
		case "processed":
			if e.Group == "" {
				e.Outcome, e.Words = OutcomeOther, "Processed; its type writes neither the subscription's state nor its payment state."
			}
		}
		entries[i] = e
	}

	// Replay the processed events of each group in processing order.
	order := make([]int, 0, len(events))
	for i, e := range entries {
		if e.Outcome == "" && keys[i] != nil {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		pa, pb := events[a].ProcessedAt, events[b].ProcessedAt
		switch {
		case pa == nil && pb == nil:
			return 0
		case pa == nil:
			return 1
		case pb == nil:
			return -1
		}
		return pa.Compare(*pb)
	})
	newest := map[string]*orderKey{}
	status := ""
	for _, i := range order {
		e := &entries[i]
		k := keys[i]
		switch {
		case newest[e.Group] != nil && k.compare(*newest[e.Group]) <= 0:
			e.Outcome = OutcomeSkippedOlder
		case e.Group == "subscription" && IsTerminal(status) && !IsTerminal(e.Status):
			e.Outcome = OutcomeSkippedTerminal
		default:
			e.Outcome = OutcomeSuperseded
			newest[e.Group] = k
			if e.Group == "subscription" {
				status = e.Status
			}
		}
	}

	// The stored keys have the last word.
	stored := map[string]*orderKey{}
	storedID := map[string]string{}
	if st.SubEventID != nil && st.SubEventCreated != nil && st.SubEventRank != nil {
		stored["subscription"] = &orderKey{st.SubEventCreated.UTC(), *st.SubEventRank, *st.SubEventID}
		storedID["subscription"] = *st.SubEventID
	}
	if st.InvEventID != nil && st.InvEventCreated != nil && st.InvEventRank != nil {
		stored["payment"] = &orderKey{st.InvEventCreated.UTC(), *st.InvEventRank, *st.InvEventID}
		storedID["payment"] = *st.InvEventID
	}
	for i := range entries {
		e := &entries[i]
		if keys[i] == nil || e.Event.Status != "processed" {
			if e.Outcome == "" {
				e.Outcome, e.Words = OutcomeOther, "Processed; it carries no creation time, so its place in the order is unknown."
			}
			continue
		}
		what := "subscription state"
		if e.Group == "payment" {
			what = "payment state"
		}
		s := stored[e.Group]
		switch {
		case storedID[e.Group] == e.Event.EventID:
			e.Outcome = OutcomeCurrent
			e.Words = "Applied: it set the current " + what + "."
		case s != nil && keys[i].compare(*s) > 0:
			switch {
			case e.Group == "subscription" && IsTerminal(st.Status) && !IsTerminal(e.Status):
				e.Outcome = OutcomeSkippedTerminal
			case e.Group == "payment":
				e.Outcome = OutcomeNotApplied
				e.Words = "Not applied: it is about an older invoice than the one the payment state follows."
			default:
				e.Outcome = OutcomeNotApplied
				e.Words = "Not applied, although newer than the stored " + what + "."
			}
		case e.Outcome == OutcomeSuperseded:
			e.Words = "Applied when processed; a newer event has replaced its " + what + " since."
		case e.Outcome == OutcomeSkippedOlder:
			e.Words = "Skipped: older than the " + what + " already stored when it was processed (the ordering guard keeps the newest event's state)."
		}
		if e.Outcome == OutcomeSkippedTerminal {
			e.Words = "Skipped: the subscription had already ended, and canceled and incomplete_expired are final."
		}
	}
	return entries
}

// StateSource says what set a column group's stored state when it was not an event of the
// given list: a read from Stripe (reconcile, re-read) or an event no longer in the log. "" when an
// event of the list did, or the group was never written.
func StateSource(storedID *string, events []webhooks.LoggedEvent) string {
	if storedID == nil || *storedID == "" {
		return ""
	}
	for _, ev := range events {
		if ev.EventID == *storedID {
			return ""
		}
	}
	return *storedID
}
