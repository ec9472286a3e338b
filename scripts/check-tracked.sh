#!/usr/bin/env bash
# No build output in the repository: no tracked file over 1 MiB and no ELF executable (a binary
# committed by mistake is cloned by everyone, forever). CI runs it before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  if [ "$size" -gt 1048576 ]; then
    echo "tracked file over 1 MiB: $f ($size bytes)" >&2
    bad=1
  fi
  if [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]; then
    echo "tracked ELF binary: $f (build outputs belong in bin/, which is ignored)" >&2
    bad=1
  fi
done < <(git ls-files -z)
exit $bad
