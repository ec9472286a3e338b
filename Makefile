# The two commands that matter: `make run` (the whole service, offline) and `make test`.
GO ?= go
PKGS := ./...

.PHONY: all build run test vet bench fuzz clean

all: build

build:
	$(GO) build -o bin/billing .

# Runs the service offline: embedded PostgreSQL under .data/, stripe-mock, generated test secrets.
run: build
	bash scripts/run.sh

# Every test, against a real PostgreSQL (started by the tests, or TEST_DATABASE_URL) and
# stripe-mock (started by the tests).
test:
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 40m $(PKGS)

vet:
	$(GO) vet $(PKGS)

# Benchmarks against PostgreSQL's own ceiling; not part of `make test`.
bench: build
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 30m ./test/

# Longer fuzzing runs of the webhook edge (the seed corpus runs in `make test`).
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzVerifySignature -fuzztime $(FUZZTIME) ./webhooks/
	$(GO) test -run '^$$' -fuzz FuzzDecodeEnvelope -fuzztime $(FUZZTIME) ./webhooks/

clean:
	rm -rf bin
