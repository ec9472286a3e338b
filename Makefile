# The two commands that matter: `make run` (the whole service, offline) and `make test`.
GO ?= go
PKGS := ./...

.PHONY: all build run test vet bench fuzz clean check-go soak soak-long

all: build

# `billing --version` names the release and the commit; the build's own VCS stamp is missing where
# -buildvcs=false is set or .git is absent, so they are passed explicitly.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)

build: check-go
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/billing .

# Go itself cannot come from the distribution's packages at the version go.mod needs.
check-go:
	@command -v $(GO) >/dev/null 2>&1 || { echo "billing: Go is not installed: install Go 1.26 or newer (https://go.dev/dl/)" >&2; exit 1; }

# Runs the service offline: embedded PostgreSQL under .data/, the dev Stripe in front of
# stripe-mock, generated test secrets. Installs the PostgreSQL server when missing and it can.
run: build
	bash scripts/ensure-postgres.sh
	bash scripts/run.sh

# Every test, against a real PostgreSQL (started by the tests, or TEST_DATABASE_URL) and
# stripe-mock (started by the tests). Installs the PostgreSQL server when missing and it can.
test: check-go
	@[ -n "$$TEST_DATABASE_URL" ] || bash scripts/ensure-postgres.sh TEST_DATABASE_URL
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 40m $(PKGS)

vet:
	$(GO) vet $(PKGS)

# Benchmarks against PostgreSQL's own ceiling (pgbench on the same durable cluster, same run);
# not part of `make test`. Results and how to read them: docs/benchmarks.md.
bench: build
	@command -v wrk >/dev/null 2>&1 || echo "note: wrk is not installed (apt-get install wrk); the entitlement read is then compared with the bare server under the Go client only"
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 90m ./test/

# Longer fuzzing runs of the webhook edge and of event decoding (their seed corpora run in
# `make test`). `go test -fuzz` takes one target per package per run, hence one line each.
# FuzzHandleEvent runs handlers on a PostgreSQL of its own (started per fuzz worker). New
# interesting inputs are minimized for at most FUZZMINIMIZETIME, so short runs keep fuzzing.
FUZZTIME ?= 60s
FUZZMINIMIZETIME ?= 10s
FUZZFLAGS = -run '^$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME)
fuzz:
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzVerifySignature$$' ./webhooks/
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzDecodeEnvelope$$' ./webhooks/
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzCheckKeys$$' ./internal/jsonkeys/
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzDecodeObject$$' ./billing/
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzHandleEvent$$' ./billing/

clean:
	rm -rf bin

# The soak (not part of `make test`): the storm at an account's scale with every fault at once —
# ≥ 10,000 events over ≥ 2,000 subscriptions, 3 replicas, ≥ 50 SIGKILLs, a PostgreSQL restart
# (-m immediate), 10 % of the events dropped, Stripe failing at random on every outbound path,
# then `billing reconcile`, the model check and `billing verify`; prints one line of figures.
# SOAK_SCALE=0.05 is a smoke run; RELIABILITY_SEED replays one. Figures: docs/benchmarks.md.
SOAK_SCALE ?= 1
soak: build
	BILLING_SOAK=1 SOAK_SCALE=$(SOAK_SCALE) $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 3h ./test/

# 30 minutes of steady load on one replica (SOAK_DURATION), RSS, goroutines, connections and the
# event table sampled every 10 s; writes docs/soak-rss.svg.
SOAK_DURATION ?= 30m
soak-long: build
	BILLING_SOAK_LONG=1 SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -v -run '^TestSoakLong$$' -timeout 2h ./test/
