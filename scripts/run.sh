#!/usr/bin/env bash
# `make run`: the whole service on this machine, offline. The embedded PostgreSQL lives under
# .data/postgres; Stripe's API is the dev Stripe in front of stripe-mock; secrets and tokens are
# generated once and kept in .data/dev.env so that they survive restarts.
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
# The app events' signing secret (Standard Webhooks: whsec_ and base64 of 32 bytes): serve pushes
# signed events when BILLING_APP_EVENTS_URL names the app's endpoint.
add_once BILLING_APP_EVENTS_SECRETS "whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
set -a
. ./.data/dev.env
set +a

# The service calls the dev Stripe (cmd/devstripe: the tests' double of Stripe in front of
# stripe-mock), which settles charges by test card as Stripe's test mode does; stripe-mock
# itself listens on the next port.
STRIPE_PORT=${STRIPE_PORT:-12111}
STRIPE_MOCK_PORT=${STRIPE_MOCK_PORT:-$((STRIPE_PORT + 1))}
export BILLING_STRIPE_MODE=test
export BILLING_STRIPE_SECRET_KEY=${BILLING_STRIPE_SECRET_KEY:-sk_test_123}
export BILLING_STRIPE_API_URL=http://127.0.0.1:${STRIPE_PORT}
export BILLING_HTTP_ADDR=${BILLING_HTTP_ADDR:-:8080}
export BILLING_LOG_FORMAT=${BILLING_LOG_FORMAT:-text}
unset BILLING_DATABASE_URL
port=${BILLING_HTTP_ADDR##*:}
export BILLING_PORTAL_RETURN_URL=${BILLING_PORTAL_RETURN_URL:-http://localhost:${port}/}
# Where Checkout sends the customer back; the app gives its own pages per request (success_url,
# cancel_url), these are the defaults so that a first Checkout call needs none.
export BILLING_CHECKOUT_SUCCESS_URL=${BILLING_CHECKOUT_SUCCESS_URL:-"http://localhost:${port}/?checkout=success&session_id={CHECKOUT_SESSION_ID}"}
export BILLING_CHECKOUT_CANCEL_URL=${BILLING_CHECKOUT_CANCEL_URL:-"http://localhost:${port}/?checkout=cancel"}

go build -o bin/stripe-mock github.com/stripe/stripe-mock
go build -o bin/devstripe ./cmd/devstripe
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
bin/stripe-mock -http-addr "127.0.0.1:${STRIPE_MOCK_PORT}" -https-addr 127.0.0.1:0 >.data/stripe-mock.log 2>&1 &
pids+=($!)
# The dev Stripe sends the events of what happens there (a completed Checkout, a renewal) to the
# service, signed with its test secret; it retries while serve is still starting.
bin/devstripe --listen "127.0.0.1:${STRIPE_PORT}" --upstream "http://127.0.0.1:${STRIPE_MOCK_PORT}" \
  --webhook-url "http://localhost:${port}/webhooks/stripe" --webhook-secret "${BILLING_STRIPE_WEBHOOK_SECRETS_TEST}" \
  >.data/devstripe.log 2>&1 &
devstripe_pid=$!
pids+=("$devstripe_pid")
# devstripe says it listens once stripe-mock answers; stop here if either gave up.
until grep -q '^devstripe: Stripe API' .data/devstripe.log; do
  if ! kill -0 "$devstripe_pid" 2>/dev/null; then
    echo "make run: the dev Stripe did not start:" >&2
    cat .data/devstripe.log .data/stripe-mock.log >&2
    exit 1
  fi
  sleep 0.1
done

api="Authorization: Bearer ${BILLING_AUTH_API_TOKENS}"
cat <<MSG

billing (test mode, offline)
  API:             http://localhost:${port}        (OpenAPI: http://localhost:${port}/openapi.json)
  admin page:      http://localhost:${port}/admin  (user: admin, password: the admin token)
  webhook secret:  ${BILLING_STRIPE_WEBHOOK_SECRETS_TEST}
  API token:       ${BILLING_AUTH_API_TOKENS}
  admin token:     ${BILLING_AUTH_ADMIN_TOKENS}
  Stripe API:      the dev Stripe at ${BILLING_STRIPE_API_URL} (log: .data/devstripe.log):
                   test cards as in Stripe's test mode; a new customer pays with pm_card_visa
  database:        embedded, under .data/postgres; serve logs the psql command to reach it (psql=...)
  app events:      bin/billing events tail   (the feed; pushed too when BILLING_APP_EVENTS_URL is set:
                   ${BILLING_APP_EVENTS_URL:-not set}, signed with BILLING_APP_EVENTS_SECRETS of .data/dev.env)

Try:
  curl -s localhost:${port}/readyz
  curl -s -X PUT -H '${api}' -H 'Content-Type: application/json' -d '{"email":"a@example.com","name":"A"}' localhost:${port}/v1/customers/user_1
  curl -s -X POST -H '${api}' -H 'Content-Type: application/json' -d '{"order_id":"order_1","user_id":"user_1","amount":1250,"currency":"eur"}' localhost:${port}/v1/charges
  # a declining card for user_1 (cus_… from the PUT answer), then charge a new order_id:
  curl -s -u ${BILLING_STRIPE_SECRET_KEY}: localhost:${STRIPE_PORT}/v1/customers/CUS_ID -d 'invoice_settings[default_payment_method]=pm_card_chargeDeclined'
  # open Checkout for user_1, pay it as the customer, then let a month pass (events go to the service):
  curl -s -X POST -H '${api}' -H 'Content-Type: application/json' -d '{"request_id":"r1","price_id":"price_1","quantity":1,"success_url":"http://localhost:${port}/","cancel_url":"http://localhost:${port}/"}' localhost:${port}/v1/customers/user_1/checkout-sessions
  bin/billing dev checkout complete CS_ID                                # or open the session's url: a card form
  bin/billing dev advance --days 31
  # seats or cancel: POST .../subscriptions/SUB_ID/change or /cancel redirects (303) to the portal; confirm it:
  bin/billing dev portal apply PORTAL_URL
  # the whole life, step by step: the README's first section
  bin/billing trigger customer.subscription.created --customer CUS_ID   # finds this service through .data/run.env
  bin/billing doctor                                                     # the same: its database, its Stripe, its secret
  curl -s -H 'Authorization: Bearer ${BILLING_AUTH_ADMIN_TOKENS}' localhost:${port}/admin/events

MSG
bin/billing serve
