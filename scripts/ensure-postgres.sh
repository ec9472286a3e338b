#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries (initdb, pg_ctl, postgres) are installed, for the
# embedded cluster of `make run` and the test clusters of `make test`. Installs them from the
# distribution's packages when it can (root, or password-less sudo, with apt-get); otherwise
# stops with one line saying what to install. Used by the Makefile and .ci/run.
#
#   scripts/ensure-postgres.sh          check, install if missing
#   SKIP_POSTGRES_INSTALL=1 …           check only
set -euo pipefail

# The same places internal/pgcluster looks (FindBinDir).
have_server() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && return 0
  fi
  for d in /usr/lib/postgresql/*/bin /usr/pgsql-*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && return 0
  done
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}

have_server && exit 0

say_install() {
  echo "billing: the PostgreSQL server is not installed: install it (Debian/Ubuntu: sudo apt-get install postgresql; Fedora: sudo dnf install postgresql-server; macOS: brew install postgresql) or set ${1:-BILLING_DATABASE_URL}" >&2
  exit 1
}

[ "${SKIP_POSTGRES_INSTALL:-}" = 1 ] && say_install "$@"
command -v apt-get >/dev/null 2>&1 || say_install "$@"
if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  say_install "$@"
fi

echo "billing: installing the PostgreSQL server (apt-get install postgresql)" >&2
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
have_server || say_install "$@"
