package billing

import "time"

// Pausing. A subscription is paused in two ways, and they are told apart on purpose:
//
//   - status paused (customer.subscription.paused / resumed): a trial that ended without a
//     payment method, or a pause through the API; never entitled, like any status but
//     trialing, active and past_due;
//   - pause_collection on an active subscription (read from customer.subscription.updated):
//     Stripe stops collecting while the service goes on; whether access goes on too is
//     policy.paused_collection_entitled (default true).
const (
	EventSubscriptionPaused  = "customer.subscription.paused"
	EventSubscriptionResumed = "customer.subscription.resumed"
)

// pauseBehavior is pause_collection.behavior, or nil when collection is not paused.
func (s *subscriptionObject) pauseBehavior() *string {
	if s.PauseCollection == nil || s.PauseCollection.Behavior == "" {
		return nil
	}
	b := s.PauseCollection.Behavior
	return &b
}

// pauseResumesAt is pause_collection.resumes_at, or nil (paused until further notice, or not
// paused).
func (s *subscriptionObject) pauseResumesAt() *time.Time {
	if s.pauseBehavior() == nil {
		return nil
	}
	return s.PauseCollection.ResumesAt.Ptr()
}
