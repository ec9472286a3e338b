-- +goose Up
-- The link between the app's user and its Stripe customer. Both sides are unique: one user never
-- gets a second Stripe customer, and one Stripe customer never serves two users.
CREATE TABLE customers (
  user_id text PRIMARY KEY,
  stripe_customer_id text UNIQUE,
  email text NOT NULL DEFAULT '',
  name text NOT NULL DEFAULT '',
  livemode boolean NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE customers;
