package billing

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"billing/internal/database"
	"billing/notices"
	"billing/webhooks"
)

// Ordering of events.
//
// Stripe delivers events out of order and retries old ones days later, so every write is
// guarded: an event is applied to a column group only when its ordering key is greater than the
// key stored with that group. The key is (event created, rank, event id):
//
//   - created: the event's own creation time (Stripe's clock, whole seconds).
//   - rank, for ties within one second. Subscription events: statusTieRank(new status)*10 +
//     type rank (created 0, updated/trial_will_end 1, deleted 2), so the later lifecycle stage
//     wins (incomplete→active at creation, active→past_due at renewal, anything→canceled).
//     Invoice events: payment_failed 0, payment_action_required 1 (the more precise word on the
//     same attempt), payment_succeeded / paid / voided 2, so a success in the same second as a
//     failure lifts the hold (the money arrived; blocking a paying customer is the worse
//     mistake).
//   - event id, byte-wise (COLLATE "C"): arbitrary but deterministic, so that every replica and
//     every replay reaches the same state.
//
// The same event applied twice has an equal key and is a no-op. On top of the guard, canceled and
// incomplete_expired are terminal: a snapshot with a non-terminal status never replaces them,
// however new (Stripe never revives a subscription; a non-terminal snapshot after one is a stale
// event with a skewed clock). Each event locks the row first (INSERT … ON CONFLICT DO NOTHING to
// make it exist, then SELECT … FOR UPDATE), so two events of one subscription processed at once
// run one after the other instead of racing.
//
// An invoice event may come before any subscription event: it creates a placeholder row with
// status 'incomplete' and sub_event_created NULL, which any subscription event overwrites. Until
// then the placeholder shows as an incomplete (not entitled) subscription of the invoice's customer.

func subEventRank(eventType, status string) int {
	typeRank := 1
	switch eventType {
	case EventSubscriptionCreated:
		typeRank = 0
	case EventSubscriptionDeleted:
		typeRank = 2
	}
	return statusTieRank(status)*10 + typeRank
}

func invEventRank(eventType string) int {
	switch invoiceEffectOf(eventType) {
	case invoiceLifts:
		return 2
	case invoiceHolds:
		if eventType == EventInvoicePaymentActionRequired {
			return 1
		}
	}
	return 0
}

// newerThanStored is the ordering guard of a column group ("sub" or "inv"): the event's key
// (created, rank, event id: the statement's parameters $created, $rank and $eventID) is above
// the key stored with the group, or none is stored yet. One expression for both groups, so the
// ordering rule above cannot drift between them.
func newerThanStored(group string, created, rank, eventID int) string {
	return fmt.Sprintf(`(%[1]s_event_created IS NULL
		OR (%[1]s_event_created, %[1]s_event_rank, %[1]s_event_id COLLATE "C")
		   < (CAST($%[2]d AS timestamptz), CAST($%[3]d AS integer), CAST($%[4]d AS text) COLLATE "C"))`, group, created, rank, eventID)
}

// lockSubscription makes sure the row exists (as a placeholder if new) and locks it for the rest
// of the transaction. It returns the row as it was before this event (UserID not set).
//
// One statement in the usual cases: the INSERT returns the row it created (locked, as any row a
// transaction inserts), or finds it already there and the locking SELECT returns it. Both run
// on the statement's snapshot, so a row another transaction inserted but had not committed when
// the statement began is returned by neither: the INSERT waited for it and did nothing. That race
// (two first events of one subscription at once) falls back to a plain SELECT … FOR UPDATE.
func (s *Service) lockSubscription(ctx context.Context, tx *gorm.DB, subscriptionID, customerID string, livemode bool) (*Subscription, error) {
	now := s.now()
	row, err := scanSubscription(ctx, tx, `
		WITH inserted AS (
		  INSERT INTO subscriptions AS s (subscription_id, stripe_customer_id, livemode, status, created_at, updated_at)
		  VALUES ($1, $2, $3, $4, $5, $5)
		  ON CONFLICT (subscription_id, livemode) DO NOTHING
		  RETURNING `+subscriptionRowColumns+`, NULL::text AS user_id
		), existing AS (
		  SELECT `+subscriptionRowColumns+`, NULL::text AS user_id FROM subscriptions s
		  WHERE s.subscription_id = $1 AND s.livemode = $3 `+webhooks.LockRows(ctx)+`
		)
		SELECT * FROM inserted UNION ALL SELECT * FROM existing`,
		subscriptionID, customerID, livemode, StatusIncomplete, now)
	if err == nil && row == nil {
		row, err = scanSubscription(ctx, tx, subscriptionByID+` `+webhooks.LockRows(ctx), subscriptionID, livemode)
	}
	if err != nil {
		return nil, fmt.Errorf("lock subscription %s: %w", subscriptionID, err)
	}
	if row == nil {
		return nil, fmt.Errorf("lock subscription %s: row not found after insert", subscriptionID)
	}
	return row, nil
}

func (s *Service) loadSubscriptionTx(ctx context.Context, tx *gorm.DB, subscriptionID string, livemode bool) (*Subscription, error) {
	row, err := scanSubscription(ctx, tx, subscriptionByID, subscriptionID, livemode)
	if err != nil {
		return nil, fmt.Errorf("load subscription %s: %w", subscriptionID, err)
	}
	if row == nil {
		return nil, fmt.Errorf("load subscription %s: not found", subscriptionID)
	}
	return row, nil
}

// subscriptionByID selects the subscription $1 of the world $2 in the shape scanSubscription reads
// (no customer joined: its user id is NULL).
const subscriptionByID = `SELECT ` + subscriptionRowColumns + `, NULL::text AS user_id FROM subscriptions s
	WHERE s.subscription_id = $1 AND s.livemode = $2`

// scanSubscription runs query, which selects subscriptionColumns (or subscriptionRowColumns and a
// NULL user id), on the handle's connection or transaction and returns its one row, or nil if
// there is none.
func scanSubscription(ctx context.Context, tx *gorm.DB, query string, args ...any) (*Subscription, error) {
	rows, err := tx.Statement.ConnPool.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	subs, err := database.ScanAll[Subscription](rows)
	if err != nil || len(subs) == 0 {
		return nil, err
	}
	return &subs[0], nil
}

// handleSubscriptionEvent applies the snapshot of a customer.subscription.* event.
func (s *Service) handleSubscriptionEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	_, err := s.applySubscriptionEvent(ctx, tx, ev)
	return err
}

// applySubscriptionEvent is handleSubscriptionEvent; applied says whether the event's snapshot
// replaced the row's (false for a stale event, or a non-terminal one after a terminal state).
func (s *Service) applySubscriptionEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) (applied bool, err error) {
	obj, err := decodeSubscription(ev.Object)
	if err != nil {
		return false, permanent("%s %s: %w", ev.Type, ev.ID, err)
	}
	status := obj.Status
	if ev.Type == EventSubscriptionDeleted && !IsTerminal(status) {
		// A deleted subscription is over whatever its snapshot says.
		status = StatusCanceled
	}
	customerID := string(obj.Customer)

	start, end := obj.Period()
	cancelAtPeriodEnd := obj.CancelAtPeriodEnd != nil && *obj.CancelAtPeriodEnd
	on, renewal := s.renewalPlan(obj, status)
	args := []any{obj.ID, ev.Livemode, customerID, // $1–$3
		status, nullString(obj.PriceID()), start.Ptr(), end.Ptr(), cancelAtPeriodEnd, // $4–$8
		obj.CancelAt.Ptr(), obj.CanceledAt.Ptr(), obj.EndedAt.Ptr(), obj.TrialStart.Ptr(), obj.TrialEnd.Ptr(), // $9–$13
		ev.ID, ev.Type, rankOf(ctx, subEventRank(ev.Type, status)), ev.Created.UTC(), s.now(), // $14–$18
		statusBeganWith(ev, status), obj.pauseBehavior(), obj.pauseResumesAt(), obj.Quantity(), // $19–$22
		on, renewal} // $23–$24

	// Most events are written by one statement: the first of a subscription inserts its row
	// whole, a newer one updates it (writeSubscription). The rest (a stale event, a customer that
	// differs, the race of two first events) take the path that locks the row first and looks.
	var prior *Subscription
	var user *string
	var due []dueReread
	var queued []int64
	w, err := s.writeSubscription(ctx, tx, args)
	if err != nil {
		return false, fmt.Errorf("apply %s %s to subscription %s: %w", ev.Type, ev.ID, obj.ID, err)
	}
	if w != nil {
		applied, user = true, w.UserID
		prior = &Subscription{SubscriptionID: obj.ID, StripeCustomerID: customerID, Livemode: ev.Livemode,
			Status: StatusIncomplete, SubEventCreated: w.PriorCreated}
		if w.PriorStatus != nil {
			prior.Status = *w.PriorStatus
		}
		due = s.rereadsOf(ev, prior, status)
		if queued, err = s.queueRereads(ctx, tx, due); err != nil {
			return false, err
		}
	} else {
		if prior, err = s.lockSubscription(ctx, tx, obj.ID, customerID, ev.Livemode); err != nil {
			return false, err
		}
		// A placeholder's customer came from an invoice; a subscription's customer never changes
		// in Stripe, so a different one on a real row means corrupt input, not an update.
		if prior.SubEventCreated != nil && prior.StripeCustomerID != customerID {
			return false, permanent("%s %s: subscription %s belongs to customer %s, event names %s",
				ev.Type, ev.ID, obj.ID, prior.StripeCustomerID, customerID)
		}
		due = s.rereadsOf(ev, prior, status)
		var n int64
		queued = make([]int64, len(due))
		if len(due) == 0 {
			n, user, err = updateReturningUser(ctx, tx, subscriptionUpdate+linkedUserReturning, args...)
		} else {
			query, params, qerr := s.withRereads(subscriptionUpdate, args, due)
			if qerr != nil {
				return false, qerr
			}
			dest := []any{&n, &user}
			for k := range queued {
				dest = append(dest, &queued[k])
			}
			err = tx.Statement.ConnPool.QueryRowContext(ctx, query, params...).Scan(dest...)
		}
		if err != nil {
			return false, fmt.Errorf("apply %s %s to subscription %s: %w", ev.Type, ev.ID, obj.ID, err)
		}
		applied = n == 1
	}
	outcome := "applied"
	if !applied {
		outcome = "stale"
		if IsTerminal(prior.Status) && !IsTerminal(status) {
			outcome = "terminal"
		}
		if err := s.applyStaleStatus(ctx, tx, ev, obj.ID, status); err != nil {
			return false, err
		}
	}
	s.events.WithLabelValues(ev.Type, outcome).Inc()
	s.log.LogAttrs(ctx, slog.LevelInfo, "subscription event",
		slog.String("event_id", ev.ID), slog.String("type", ev.Type),
		slog.String("subscription_id", obj.ID), slog.String("outcome", outcome),
		slog.String("from", prior.Status), slog.String("to", status))
	for k, r := range due {
		if queued[k] > 0 {
			s.log.DebugContext(ctx, "subscription re-read queued", "subscription_id", obj.ID,
				"reason", r.args.reason(), "at", r.at.UTC())
		}
	}

	// The applied UPDATE named the customer's user; a stale event may still move status_since,
	// which breaks ties between subscriptions, and looks the user up.
	if applied {
		err = s.tellLinkedUser(ctx, tx, user, ev.Livemode)
	} else {
		err = s.tellCustomer(ctx, tx, customerID, ev.Livemode)
	}
	if err != nil {
		return false, err
	}
	if ev.Type != EventSubscriptionTrialWillEnd {
		return applied, nil
	}
	return applied, s.trialWillEnd(ctx, tx, ev, obj.ID)
}

// trialWillEnd records the event and enqueues the trial-ending notice, unless the subscription
// (as it stands after this event, so including newer events already applied) is no longer
// trialing: a customer who converted or canceled meanwhile gets no "your trial ends" mail.
func (s *Service) trialWillEnd(ctx context.Context, tx *gorm.DB, ev webhooks.Event, subscriptionID string) error {
	err := tx.WithContext(ctx).Exec(`
		UPDATE subscriptions SET trial_will_end_at = GREATEST(trial_will_end_at, CAST($1 AS timestamptz))
		WHERE subscription_id = $2 AND livemode = $3`, ev.Created.UTC(), subscriptionID, ev.Livemode).Error
	if err != nil {
		return fmt.Errorf("record trial_will_end of %s: %w", subscriptionID, err)
	}
	cur, err := s.loadSubscriptionTx(ctx, tx, subscriptionID, ev.Livemode)
	if err != nil {
		return err
	}
	if cur.Status != StatusTrialing {
		s.log.InfoContext(ctx, "trial ending notice skipped: subscription no longer trialing",
			"event_id", ev.ID, "subscription_id", subscriptionID, "status", cur.Status)
		return nil
	}
	// A late delivery (retried for days) or the event of a trial that was ended early: the
	// subscription still reads trialing until Stripe's update arrives, but "your trial ends"
	// about a trial that is over is wrong.
	if cur.TrialEnd == nil || !cur.TrialEnd.After(ev.Created) || !cur.TrialEnd.After(s.now()) {
		s.log.InfoContext(ctx, "trial ending notice skipped: trial already ended",
			"event_id", ev.ID, "subscription_id", subscriptionID, "trial_end", cur.TrialEnd)
		return nil
	}
	return s.notices.Enqueue(ctx, tx, notices.Input{
		EventID:          ev.ID,
		Kind:             notices.KindTrialWillEnd,
		SubscriptionID:   cur.SubscriptionID,
		StripeCustomerID: cur.StripeCustomerID,
		Livemode:         ev.Livemode,
		TrialEnd:         cur.TrialEnd,
	})
}

// handleInvoiceEvent applies invoice.payment_failed / invoice.payment_succeeded to the payment-hold
// columns of the invoice's subscription.
func (s *Service) handleInvoiceEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	_, err := s.applyInvoiceEvent(ctx, tx, ev)
	return err
}

// applyInvoiceEvent is handleInvoiceEvent; applied says whether the event took the payment
// columns of its subscription.
func (s *Service) applyInvoiceEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) (applied bool, err error) {
	inv, err := decodeInvoice(ev.Object)
	if err != nil {
		return false, permanent("%s %s: %w", ev.Type, ev.ID, err)
	}
	subscriptionID := inv.SubscriptionID()
	if subscriptionID == "" {
		// A one-off invoice: no subscription, nothing to hold; only the customer's list.
		s.events.WithLabelValues(ev.Type, "one_off").Inc()
		return false, s.keepInvoice(ctx, tx, ev, inv)
	}
	customerID := string(inv.Customer)
	if customerID == "" {
		return false, permanent("%s %s: invoice %s has no customer", ev.Type, ev.ID, inv.ID)
	}

	effect := invoiceEffectOf(ev.Type)
	if effect == invoiceRecordOnly {
		if _, err := s.lockInvoiceSubscription(ctx, tx, ev, inv.ID, subscriptionID, customerID); err != nil {
			return false, err
		}
		s.events.WithLabelValues(ev.Type, "recorded").Inc()
		return false, s.keepInvoice(ctx, tx, ev, inv)
	}

	failed := effect == invoiceHolds
	var nextAttempt *time.Time
	if failed {
		nextAttempt = inv.NextPaymentAttempt.Ptr()
	}
	// The payment columns follow the newest invoice: an event about a newer invoice (by its
	// creation) wins over any about an older one, whatever their own order, and within one
	// invoice the newer event wins. So the outcome does not depend on delivery order: a late
	// payment of an older invoice neither lifts a newer invoice's hold nor, applied first, makes
	// that invoice's failure look stale. Events without an invoice time fall back to event order,
	// where a payment lifts a hold only when its invoice was created at or after the held one.
	args := []any{subscriptionID, ev.Livemode, // $1–$2
		failed, ev.Created.UTC(), inv.ID, inv.AttemptCount, nextAttempt, inv.AmountDue, inv.Currency, inv.HostedInvoiceURL, // $3–$10
		ev.ID, ev.Type, ev.Created.UTC(), rankOf(ctx, invEventRank(ev.Type)), s.now(), // $11–$15
		inv.Created.Ptr(), inv.BillingReason, holdKindOf(ev.Type), customerID} // $16–$19
	// The invoice's row is written by the same statement (the customer is known, so there is one).
	kept, keptArgs := s.keptInvoice(ctx, ev, inv, len(args)+1)
	args = append(args, keptArgs...)
	// One statement when the subscription's row is there, of this customer, and the event is
	// newer. When it applies nothing, the row is locked (made, as a placeholder, when missing) and
	// looked at, and the statement runs again: now it applies to a placeholder, and to a row that
	// was there it applies nothing again (its invoice is kept already, under the invoice's guard).
	n, user, status, err := s.applyInvoiceStatement(ctx, tx, kept, args)
	if err == nil && n == 0 {
		var prior *Subscription
		if prior, err = s.lockInvoiceSubscription(ctx, tx, ev, inv.ID, subscriptionID, customerID); err != nil {
			return false, err
		}
		if n, user, status, err = s.applyInvoiceStatement(ctx, tx, kept, args); n == 0 {
			status = prior.Status
		}
	}
	if err != nil {
		return false, fmt.Errorf("apply %s %s to invoice %s and subscription %s: %w", ev.Type, ev.ID, inv.ID, subscriptionID, err)
	}
	prior := &Subscription{Status: status} // what the notice's rule looks at: the invoice's event leaves it
	applied = n == 1
	outcome := "applied"
	if !applied {
		outcome = "stale"
	}
	s.events.WithLabelValues(ev.Type, outcome).Inc()
	s.log.LogAttrs(ctx, slog.LevelInfo, "invoice event",
		slog.String("event_id", ev.ID), slog.String("type", ev.Type),
		slog.String("subscription_id", subscriptionID), slog.String("invoice_id", inv.ID),
		slog.String("outcome", outcome))
	if applied {
		if err := s.tellLinkedUser(ctx, tx, user, ev.Livemode); err != nil {
			return false, err
		}
	}

	// Only a failure that is the newest word on the subscription's payments is worth a mail: a
	// stale one (already paid, or superseded by a later attempt) would only confuse. Nor is the
	// first invoice of a subscription that never started (Checkout abandoned or declined): the
	// customer was never given access and is told on the payment page.
	if !failed || !applied || IsTerminal(prior.Status) || isSnapshot(ctx) ||
		neverStarted(prior.Status, deref(inv.BillingReason)) {
		return applied, nil
	}
	kind := notices.KindPaymentFailed
	if ev.Type == EventInvoicePaymentActionRequired {
		kind = notices.KindPaymentActionRequired
	}
	in := notices.Input{
		EventID:            ev.ID,
		Kind:               kind,
		SubscriptionID:     subscriptionID,
		StripeCustomerID:   customerID,
		Livemode:           ev.Livemode,
		InvoiceID:          inv.ID,
		AmountDue:          inv.AmountDue,
		HostedInvoiceURL:   deref(inv.HostedInvoiceURL),
		NextPaymentAttempt: nextAttempt,
	}
	if inv.Currency != nil {
		in.Currency = *inv.Currency
	}
	if inv.AttemptCount != nil {
		in.AttemptCount = *inv.AttemptCount
	}
	if inv.CustomerEmail != nil {
		in.FallbackEmail = *inv.CustomerEmail
	}
	return applied, s.notices.Enqueue(ctx, tx, in)
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
