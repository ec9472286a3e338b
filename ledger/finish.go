package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// The ledger finishes itself. A row left pending by a crash between its commit and Stripe's
// answer (or by an outage no client retried) is finished by a periodic River job, through the
// very path a repeat of the request takes (finishCharge / finishRefund, hence outbound.Run): the
// row's own idempotency key, and past the key window a search for an earlier attempt's object
// before anything is created. River runs periodic jobs on its elected leader only, so one replica
// at a time does it; and the row lock the protocol holds across the call keeps a concurrent
// repeat of the request from making a second call anyway.

// FinishPendingArgs is the periodic job that finishes pending ledger rows.
type FinishPendingArgs struct{}

func (FinishPendingArgs) Kind() string { return "ledger_finish_pending" }

func (FinishPendingArgs) InsertOpts() river.InsertOpts {
	// A run that fails is simply the next period's work.
	return river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByPeriod: finishInterval}}
}

const (
	finishInterval = time.Minute
	// finishMinAge leaves a row alone while its own request may still be finishing it (the
	// request's ledger section is bounded by callTimeout).
	finishMinAge = 2 * callTimeout
	// finishBatch bounds one run; the rest waits for the next. Rows never tried come first, then
	// the least recently tried, so that rows Stripe keeps refusing cannot starve the others.
	finishBatch = 100
)

type finishWorker struct {
	river.WorkerDefaults[FinishPendingArgs]
	s *Service
}

func (w *finishWorker) Work(ctx context.Context, _ *river.Job[FinishPendingArgs]) error {
	_, err := w.s.FinishPending(ctx, finishMinAge)
	return err
}

// AddWorkers registers the ledger's River worker.
func (s *Service) AddWorkers(w *river.Workers) {
	river.AddWorker(w, &finishWorker{s: s})
}

// PeriodicJobs returns the ledger's periodic jobs for River's config.
func (s *Service) PeriodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(finishInterval), func() (river.JobArgs, *river.InsertOpts) {
			return FinishPendingArgs{}, nil
		}, &river.PeriodicJobOpts{RunOnStart: true}),
	}
}

// FinishResult counts what one FinishPending run did.
type FinishResult struct {
	Charges, Refunds int // rows taken up
	Finished         int // rows completed (or found completed by a concurrent request)
}

type pendingKey struct {
	OrderID  string `gorm:"column:order_id"`
	RefundID string `gorm:"column:refund_id"`
}

// FinishPending finishes the pending rows of the service's mode that are older than minAge,
// oldest first, charges before refunds (a refund needs its charge's PaymentIntent). A row of the
// other mode is never touched: its key belongs to the other mode's account.
func (s *Service) FinishPending(ctx context.Context, minAge time.Duration) (FinishResult, error) {
	var res FinishResult
	cutoff := s.now().UTC().Add(-minAge)
	var charges []pendingKey
	if err := s.db.WithContext(ctx).Raw(`
		SELECT order_id FROM charges WHERE state = $1 AND livemode = $2 AND created_at <= $3
		ORDER BY last_attempt_at NULLS FIRST, created_at LIMIT $4`, statePending, s.livemode, cutoff, finishBatch).Scan(&charges).Error; err != nil {
		return res, fmt.Errorf("list pending charges: %w", err)
	}
	// A run ends with its context (River's job timeout); what is left is the next run's.
	for _, k := range charges {
		if ctx.Err() != nil {
			return res, nil
		}
		res.Charges++
		if s.finishPendingCharge(ctx, k.OrderID) {
			res.Finished++
		}
	}
	var refunds []pendingKey
	if err := s.db.WithContext(ctx).Raw(`
		SELECT r.order_id, r.refund_id FROM refunds r JOIN charges c ON c.order_id = r.order_id AND c.livemode = r.livemode
		WHERE r.state = $1 AND r.livemode = $2 AND r.created_at <= $3 AND c.payment_intent_id IS NOT NULL
		ORDER BY r.last_attempt_at NULLS FIRST, r.created_at LIMIT $4`, statePending, s.livemode, cutoff, finishBatch).Scan(&refunds).Error; err != nil {
		return res, fmt.Errorf("list pending refunds: %w", err)
	}
	for _, k := range refunds {
		if ctx.Err() != nil {
			return res, nil
		}
		res.Refunds++
		if s.finishPendingRefund(ctx, k.OrderID, k.RefundID) {
			res.Finished++
		}
	}
	if res.Charges+res.Refunds > 0 {
		s.log.InfoContext(ctx, "pending ledger rows taken up", "charges", res.Charges, "refunds", res.Refunds, "finished", res.Finished)
	}
	return res, nil
}

// finishPendingCharge takes the steps a repeat of the request would: the payment method first
// if the crash came before it was recorded, then the outbound call.
func (s *Service) finishPendingCharge(ctx context.Context, orderID string) bool {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	row, found, err := s.loadCharge(ctx, s.db, orderID)
	if err != nil || !found || row.State != statePending {
		return err == nil && found
	}
	if row.PaymentMethodID == nil {
		if err := s.resolvePaymentMethod(ctx, row); err != nil {
			s.log.WarnContext(ctx, "pending charge not finished: payment method lookup failed", "order_id", orderID, "error", err)
			return false
		}
	}
	rep := s.finishCharge(ctx, orderID)
	return s.completed(ctx, rep, `SELECT state FROM charges WHERE order_id = $1 AND livemode = $2`, orderID, s.livemode)
}

func (s *Service) finishPendingRefund(ctx context.Context, orderID, refundID string) bool {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	rep := s.finishRefund(ctx, orderID, refundID)
	return s.completed(ctx, rep, `SELECT state FROM refunds WHERE order_id = $1 AND refund_id = $2 AND livemode = $3`, orderID, refundID, s.livemode)
}

// completed reports whether the row (query selects its state) is completed now, a success or a
// refusal recorded; it logs a row that stays pending with the attempt's answer.
func (s *Service) completed(ctx context.Context, rep reply, query string, args ...any) bool {
	var states []string
	if err := s.db.WithContext(ctx).Raw(query, args...).Scan(&states).Error; err == nil && len(states) == 1 && states[0] == stateCompleted {
		return true
	}
	s.log.WarnContext(ctx, "pending ledger row not finished; the next run tries again", "row", args, "error", rep.Err)
	return false
}
