# syntax=docker/dockerfile:1
#
# The billing service as a container image: `docker build -t billing .`, then see docs/deploy.md.
# The image runs `billing serve`; `docker run … billing migrate` runs another subcommand instead.
# It needs a PostgreSQL URL (BILLING_DATABASE_URL): the embedded cluster of `make run` is not in
# the image, and `serve` without database.url stops with a message saying so.

# --- build: a static binary --------------------------------------------------------------------
FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a change to the code does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
# CGO_ENABLED=0: no libc dependency, so the binary runs on any base image. -trimpath and -s -w:
# no build paths, symbol table or DWARF in the binary. .git stays out of the context, so the
# release and commit that `billing --version` names come as build arguments:
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) --build-arg COMMIT=$(git rev-parse HEAD) -t billing .
# Left empty, --version says "(devel)" and "commit unknown".
ARG VERSION=
ARG COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/billing .

# --- runtime -----------------------------------------------------------------------------------
# debian:12-slim rather than distroless: a HEALTHCHECK needs a program that can GET /readyz, and
# the binary has no such subcommand while distroless has no curl or wget. curl is the only
# package added; ca-certificates is needed to call https://api.stripe.com and TLS databases.
FROM debian:12-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
# A fixed, unprivileged uid/gid (Kubernetes' runAsNonRoot can check a numeric USER).
RUN groupadd --system --gid 10001 billing \
    && useradd --system --uid 10001 --gid billing --home-dir /app --create-home \
       --shell /usr/sbin/nologin billing
COPY --from=build /out/billing /usr/local/bin/billing
WORKDIR /app
USER 10001:10001

# The healthcheck below reads the port from BILLING_HTTP_ADDR: change the listen address with
# this variable (not with http.addr in a config file), or the healthcheck probes the wrong port.
ENV BILLING_HTTP_ADDR=:8080
EXPOSE 8080
# /readyz answers 200 once the database is reachable and its schema current (migrations run at
# start, under an advisory lock that other replicas may hold for a while: hence start-period).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD curl -fsS -o /dev/null "http://127.0.0.1:${BILLING_HTTP_ADDR##*:}/readyz" || exit 1

# SIGTERM (Docker's default stop signal) stops the service gracefully: stop accepting, finish
# in-flight requests and jobs. Give it time: `docker run --stop-timeout 60`, compose's
# stop_grace_period, Kubernetes' terminationGracePeriodSeconds (docs/deploy.md).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/billing"]
CMD ["serve"]
