#!/usr/bin/env bash
# A/B of two sglrs servers on the shared_prefix workload, runs alternating (A B A B ...) so
# that both see the same load; the cache is flushed before every run, so each run computes
# its prefix afresh (as the first run of scripts/bench-serving-peers.sh does).
#
#   scripts/bench-serving-ab.sh                         # A: --admission-hold-ms 0, B: default
#   A_BIN=old/sglrs B_BIN=new/sglrs scripts/bench-serving-ab.sh   # two binaries
#
# Prints per run: total seconds (client wall clock) and the server's CPU seconds during the
# run (/proc/PID/stat utime + stime), then the medians and the median of the B/A ratios.
#
# Environment: A_BIN, B_BIN (default: $SGLRS or target/release/sglrs), A_ARGS (default
# "--admission-hold-ms 0"), B_ARGS (default ""), ROUNDS (pairs, 5), THREADS (2),
# SGLRS_MODEL, PORT_A (30131), PORT_B (30132), OUT (log folder).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SGLRS=${SGLRS:-${CARGO_TARGET_DIR:-$ROOT/target}/release/sglrs}
A_BIN=${A_BIN:-$SGLRS}
B_BIN=${B_BIN:-$SGLRS}
A_ARGS=${A_ARGS---admission-hold-ms 0}
B_ARGS=${B_ARGS:-}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
MODEL=${SGLRS_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
PORT_A=${PORT_A:-30131}
PORT_B=${PORT_B:-30132}
OUT=${OUT:-/tmp/bench-serving-ab}

for b in "$A_BIN" "$B_BIN"; do
    [ -x "$b" ] || { echo "no sglrs binary at $b" >&2; exit 1; }
done
[ -f "$MODEL" ] || { echo "no model at $MODEL (scripts/fetch-model.sh, or set SGLRS_MODEL)" >&2; exit 1; }
mkdir -p "$OUT"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT INT TERM

# shellcheck disable=SC2086 # the *_ARGS are word lists on purpose
"$A_BIN" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT_A" --threads "$THREADS" \
    --served-model-name smollm2 $A_ARGS >"$OUT/a.log" 2>&1 &
PID_A=$!
PIDS+=("$PID_A")
# shellcheck disable=SC2086
"$B_BIN" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT_B" --threads "$THREADS" \
    --served-model-name smollm2 $B_ARGS >"$OUT/b.log" 2>&1 &
PID_B=$!
PIDS+=("$PID_B")
for port in "$PORT_A" "$PORT_B"; do
    t=0
    until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; do
        sleep 0.5
        t=$((t + 1))
        [ "$t" -lt 1200 ] || { echo "server on port $port did not start; see $OUT" >&2; exit 1; }
    done
done

cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# one NAME PORT PID: one flushed shared_prefix run; prints "NAME total CPU".
one() {
    curl -sf -X POST "http://127.0.0.1:$2/flush_cache" >/dev/null
    local c0 c1 total
    c0=$(cpu_of "$3")
    total=$("$A_BIN" bench serving --base-url "http://127.0.0.1:$2" --only shared_prefix \
        --repeat 1 | grep -oE 'total [0-9.]+ s' | grep -oE '[0-9.]+')
    c1=$(cpu_of "$3")
    echo "$1 $total $(awk -v a="$c0" -v b="$c1" 'BEGIN{printf "%.2f", (b - a) / 100}')"
}

RESULTS="$OUT/results.txt"
: >"$RESULTS"
for _ in $(seq "$ROUNDS"); do
    one A "$PORT_A" "$PID_A" | tee -a "$RESULTS"
    one B "$PORT_B" "$PID_B" | tee -a "$RESULTS"
done
python3 - "$RESULTS" <<'EOF'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
a = [(float(t), float(c)) for n, t, c in rows if n == "A"]
b = [(float(t), float(c)) for n, t, c in rows if n == "B"]
ratio = lambda i: st.median(y[i] / x[i] for x, y in zip(a, b))
print(f"total s: A median {st.median(x[0] for x in a):.2f}, B median {st.median(x[0] for x in b):.2f}, median B/A {ratio(0):.3f}")
print(f"server CPU s: A median {st.median(x[1] for x in a):.2f}, B median {st.median(x[1] for x in b):.2f}, median B/A {ratio(1):.3f}")
EOF
