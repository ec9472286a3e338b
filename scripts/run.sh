#!/usr/bin/env bash
# `make run`: the whole service on this machine, offline. The embedded PostgreSQL lives under
# .data/postgres; Stripe's API is stripe-mock; secrets and tokens are generated once and kept in
# .data/dev.env so that they survive restarts.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .data

# serve refuses to start without both token lists and a webhook secret, and tokens need 32
# characters or more: each token is a prefix and 32 random hex digits. Only missing keys are
# generated, so the values survive restarts and a deleted line comes back.
rnd() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
touch .data/dev.env
add_once() { grep -q "^$1=" .data/dev.env || echo "$1=$2" >> .data/dev.env; }
add_once BILLING_STRIPE_WEBHOOK_SECRETS_TEST "whsec_$(rnd 24)"
add_once BILLING_AUTH_API_TOKENS "app_$(rnd 16)"
add_once BILLING_AUTH_ADMIN_TOKENS "admin_$(rnd 16)"
set -a
. ./.data/dev.env
set +a

STRIPE_MOCK_PORT=${STRIPE_MOCK_PORT:-12111}
export BILLING_STRIPE_MODE=test
export BILLING_STRIPE_SECRET_KEY=${BILLING_STRIPE_SECRET_KEY:-sk_test_123}
export BILLING_STRIPE_API_URL=http://127.0.0.1:${STRIPE_MOCK_PORT}
export BILLING_HTTP_ADDR=${BILLING_HTTP_ADDR:-:8080}
export BILLING_LOG_FORMAT=${BILLING_LOG_FORMAT:-text}
unset BILLING_DATABASE_URL
port=${BILLING_HTTP_ADDR##*:}
export BILLING_PORTAL_RETURN_URL=${BILLING_PORTAL_RETURN_URL:-http://localhost:${port}/}

go build -o bin/stripe-mock github.com/stripe/stripe-mock
bin/stripe-mock -http-port "$STRIPE_MOCK_PORT" -https-port $((STRIPE_MOCK_PORT + 1)) >.data/stripe-mock.log 2>&1 &
mock_pid=$!
trap 'kill $mock_pid 2>/dev/null || true' EXIT

cat <<MSG

billing (test mode, offline)
  API:             http://localhost:${port}
  webhook secret:  ${BILLING_STRIPE_WEBHOOK_SECRETS_TEST}
  API token:       ${BILLING_AUTH_API_TOKENS}
  admin token:     ${BILLING_AUTH_ADMIN_TOKENS}
  Stripe API:      stripe-mock at ${BILLING_STRIPE_API_URL}

Try:
  curl -s localhost:${port}/readyz
  bin/billing trigger customer.subscription.created --url http://localhost:${port}/webhooks/stripe --secret ${BILLING_STRIPE_WEBHOOK_SECRETS_TEST}
  curl -s -H 'Authorization: Bearer ${BILLING_AUTH_ADMIN_TOKENS}' localhost:${port}/admin/events
  curl -s -X PUT -H 'Authorization: Bearer ${BILLING_AUTH_API_TOKENS}' -d '{"email":"a@example.com","name":"A"}' localhost:${port}/v1/customers/user_1
  open http://localhost:${port}/admin  (user: admin, password: the admin token)

MSG
bin/billing serve
