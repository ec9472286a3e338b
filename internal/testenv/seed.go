package testenv

import (
	"database/sql"
	"fmt"
	"strconv"
)

// SeedFeatures is how many features (feature_00, feature_01, …) SeedUsers grants a customer.
const SeedFeatures = 12

// SeedUsers stores, by SQL, users user_1…user_{users} of the entitlement benchmarks: each linked
// to customer cus_bench_N with an active subscription sub_bench_N, every fifth also with an older
// canceled one (sub_old_N), every tenth past_due with a payment hold; every customer but each
// seventh has SeedFeatures features. It then vacuums and analyzes the tables, so that the
// planner sees their real size.
func SeedUsers(db *sql.DB, users int) error {
	for _, stmt := range []string{
		`INSERT INTO customers (user_id, stripe_customer_id, email, name, livemode)
		SELECT 'user_' || g, 'cus_bench_' || g, 'user' || g || '@example.com', 'User ' || g, false
		FROM generate_series(1, $1::int) g`,
		`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id,
			current_period_start, current_period_end, status_since, sub_event_id, sub_event_type, sub_event_created, sub_event_rank,
			payment_hold, payment_hold_since, created_at, updated_at)
		SELECT 'sub_bench_' || g, 'cus_bench_' || g, false, CASE WHEN g % 10 = 0 THEN 'past_due' ELSE 'active' END, 'price_bench',
			now() - interval '5 days', now() + interval '25 days', now() - interval '5 days', 'evt_seed_' || g,
			'customer.subscription.created', now() - interval '5 days', 10,
			g % 10 = 0, CASE WHEN g % 10 = 0 THEN now() - interval '1 day' END, now() - interval '5 days', now()
		FROM generate_series(1, $1::int) g`,
		`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id,
			current_period_start, current_period_end, canceled_at, ended_at, status_since, sub_event_id, sub_event_type, sub_event_created,
			sub_event_rank, created_at, updated_at)
		SELECT 'sub_old_' || g, 'cus_bench_' || g, false, 'canceled', 'price_old', now() - interval '90 days', now() - interval '60 days',
			now() - interval '60 days', now() - interval '60 days', now() - interval '60 days', 'evt_old_' || g,
			'customer.subscription.deleted', now() - interval '60 days', 32, now() - interval '90 days', now()
		FROM generate_series(5, $1::int, 5) g`,
		`INSERT INTO customer_features (stripe_customer_id, livemode, lookup_keys, feat_event_id, feat_event_type,
			feat_event_created, feat_event_rank)
		SELECT 'cus_bench_' || g, false, ARRAY(SELECT 'feature_' || lpad(k::text, 2, '0') FROM generate_series(0, ` + strconv.Itoa(SeedFeatures-1) + `) k),
			'evt_feat_' || g, 'entitlements.active_entitlement_summary.updated', now() - interval '5 days', 0
		FROM generate_series(1, $1::int) g WHERE g % 7 <> 0`,
	} {
		if _, err := db.Exec(stmt, users); err != nil {
			return fmt.Errorf("seed users: %w", err)
		}
	}
	for _, stmt := range []string{`VACUUM ANALYZE customers`, `VACUUM ANALYZE subscriptions`, `VACUUM ANALYZE customer_features`} {
		if _, err := db.Exec(stmt); err != nil {
			return fmt.Errorf("seed users: %w", err)
		}
	}
	return nil
}
