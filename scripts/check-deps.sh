#!/usr/bin/env bash
# The programs a user runs link no test code: the service links neither the testing package nor
# the Stripe emulator nor the dev Stripe nor any test helper, and the dev Stripe (cmd/devstripe:
# the emulator with internal/devstripe's hooks) links neither the testing package nor the tests'
# helpers. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
if go list -deps . | grep -E -x 'testing|billing/billing/billingtest|billing/internal/(stripeemu|stripetest|devstripe|testenv|apitest)'; then
  echo "check-deps: the billing binary links test code (above)" >&2
  fail=1
fi
if go list -deps ./cmd/devstripe | grep -E -x 'testing|billing/billing/billingtest|billing/internal/(stripetest|testenv|apitest)'; then
  echo "check-deps: the dev Stripe links test code (above)" >&2
  fail=1
fi
exit "$fail"
