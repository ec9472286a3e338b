#!/usr/bin/env bash
# The programs a user runs link no test code: the service links neither the testing package nor
# the test double of Stripe nor the dev Stripe, and the dev Stripe (cmd/devstripe: that double
# with internal/devstripe's hooks) links no testing package. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
if go list -deps . | grep -E -x 'testing|billing/internal/(stripetest|devstripe|testenv|apitest)'; then
  echo "check-deps: the billing binary links test code (above)" >&2
  fail=1
fi
if go list -deps ./cmd/devstripe | grep -x 'testing'; then
  echo "check-deps: the dev Stripe links the testing package" >&2
  fail=1
fi
exit "$fail"
