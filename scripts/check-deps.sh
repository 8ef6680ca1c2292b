#!/usr/bin/env bash
# Fails when a library crate depends on sglrs-benches, or when the Python extension links the
# transport stack (quinn, rustls, tar) it never uses. Reads `cargo tree`; compiles nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for p in sglrs-radix-cache sglrs-grammar sglrs-transfer sglrs-model sglrs-executor \
         sglrs-scheduler sglrs-server sglrs-python; do
    if cargo tree -p "$p" -e normal --prefix none | grep -q '^sglrs-benches '; then
        echo "check-deps: $p depends on sglrs-benches" >&2
        status=1
    fi
done
bad=$(cargo tree -p sglrs-python -e normal --prefix none | grep -E '^(quinn|quinn-proto|rustls|tar) ' | sort -u || true)
if [ -n "$bad" ]; then
    echo "check-deps: the python-frontend extension links: $bad" >&2
    status=1
fi
[ "$status" = 0 ] && echo "check-deps: no library crate depends on sglrs-benches; python-frontend links no quinn/rustls/tar"
exit "$status"
