#!/usr/bin/env bash
# Side-by-side `sglrs bench serving` against sglrs, llama.cpp (llama-cpp-python's server) and
# vLLM-CPU, one server at a time on this machine, with the same model.
#
#   scripts/bench-serving-peers.sh            # table on stdout, one JSON object on the last line
#
# - sglrs: `sglrs serve` (jump-forward on) plus a second one with --disable-jump-forward, so
#   the json workload reports jump-forward on vs off.
# - llama.cpp: only if $LLAMA_VENV/bin/python exists (install: ../shared/peers/README.md).
# - vLLM-CPU: only if $VLLM_VENV/bin/python exists; it needs an HF folder, written once from
#   the GGUF with `sglrs export-hf --dtype bf16` into $HF_DIR.
# Every server binds 127.0.0.1 and is stopped by its PID (also on Ctrl-C / error).
#
# Environment: SGLRS (binary), SGLRS_MODEL (GGUF), THREADS (2), LLAMA_VENV (/tmp/llamapeer),
# VLLM_VENV (/tmp/vllmpeer), HF_DIR (/tmp/sglrs-hf-smollm2), OUT (log folder),
# JSON_REQUESTS (8 per temperature), REPEAT (shared_prefix runs, each with its own prefix;
# the median is reported, 3), ONLY (workloads, default all), PEERS (sglrs,llamacpp,vllm),
# START_TIMEOUT (seconds to wait for a server, 900).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SGLRS=${SGLRS:-${CARGO_TARGET_DIR:-$ROOT/target}/release/sglrs}
MODEL=${SGLRS_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
LLAMA_VENV=${LLAMA_VENV:-/tmp/llamapeer}
VLLM_VENV=${VLLM_VENV:-/tmp/vllmpeer}
HF_DIR=${HF_DIR:-/tmp/sglrs-hf-smollm2}
OUT=${OUT:-/tmp/bench-serving-peers}
JSON_REQUESTS=${JSON_REQUESTS:-8}
REPEAT=${REPEAT:-3}
ONLY=${ONLY:-shared_prefix,concurrent,json}
PEERS=${PEERS:-sglrs,llamacpp,vllm}
START_TIMEOUT=${START_TIMEOUT:-900}

[ -x "$SGLRS" ] || { echo "no sglrs binary at $SGLRS (cargo build --release --bin sglrs, or set SGLRS)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "no model at $MODEL (scripts/fetch-model.sh, or set SGLRS_MODEL)" >&2; exit 1; }
mkdir -p "$OUT"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap cleanup EXIT INT TERM

# start NAME PORT CMD...: starts a server in the background, waits until /v1/models answers.
start() {
    local name=$1 port=$2
    shift 2
    "$@" >"$OUT/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    local t=0
    until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited while starting; see $OUT/$name.log" >&2
            tail -n 20 "$OUT/$name.log" >&2
            return 1
        fi
        sleep 2
        t=$((t + 2))
        if [ "$t" -ge "$START_TIMEOUT" ]; then
            echo "$name did not answer within ${START_TIMEOUT}s; see $OUT/$name.log" >&2
            return 1
        fi
    done
    echo "$name up on port $port (pid $pid, ${t}s)" >&2
}

# bench NAME PEER URL [extra args]: runs the bench, keeps its last (JSON) line.
bench() {
    local name=$1 peer=$2 url=$3
    shift 3
    echo "== $name: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    if "$SGLRS" bench serving --base-url "$url" --peer "$peer" --only "$ONLY" \
        --json-requests "$JSON_REQUESTS" --repeat "$REPEAT" --json "$@" >"$OUT/$name.bench.txt" 2>&1; then
        tail -n 1 "$OUT/$name.bench.txt" >"$OUT/$name.json"
    else
        # A peer that fails a workload (or times out) is reported, not fatal.
        python3 -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' \
            "$(grep -m1 '^Error' "$OUT/$name.bench.txt" || echo failed)" >"$OUT/$name.json"
    fi
    cat "$OUT/$name.bench.txt" >&2
}

RESULTS=()
has() { [[ ",$PEERS," == *",$1,"* ]]; }

if has sglrs; then
    start sglrs 30000 "$SGLRS" serve --model "$MODEL" --host 127.0.0.1 --port 30000 \
        --threads "$THREADS" --served-model-name smollm2
    start sglrs-nojf 30001 "$SGLRS" serve --model "$MODEL" --host 127.0.0.1 --port 30001 \
        --threads "$THREADS" --served-model-name smollm2 --disable-jump-forward
    bench sglrs sglrs http://127.0.0.1:30000 --compare-url http://127.0.0.1:30001
    cleanup
    RESULTS+=(sglrs)
fi

if has llamacpp && [ -x "$LLAMA_VENV/bin/python" ]; then
    start llamacpp 8081 "$LLAMA_VENV/bin/python" -m llama_cpp.server --model "$MODEL" \
        --host 127.0.0.1 --port 8081 --n_ctx 8192 --n_threads "$THREADS" \
        --n_threads_batch "$THREADS" --logits_all False --interrupt_requests False \
        --model_alias smollm2
    bench llamacpp llamacpp http://127.0.0.1:8081
    cleanup
    RESULTS+=(llamacpp)
elif has llamacpp; then
    echo "llama.cpp: no venv at $LLAMA_VENV, skipped" >&2
fi

if has vllm && [ -x "$VLLM_VENV/bin/python" ]; then
    if [ ! -f "$HF_DIR/config.json" ]; then
        "$SGLRS" export-hf --model "$MODEL" --out "$HF_DIR" --dtype bf16 >&2
    fi
    start vllm 8082 env VLLM_CPU_KVCACHE_SPACE=4 VLLM_HOST_IP=127.0.0.1 \
        VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))" \
        "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$HF_DIR" \
        --host 127.0.0.1 --port 8082 --served-model-name smollm2 --enable-prefix-caching
    bench vllm vllm http://127.0.0.1:8082
    cleanup
    RESULTS+=(vllm)
elif has vllm; then
    echo "vLLM: no venv at $VLLM_VENV, skipped" >&2
fi

# Table, then one JSON object {name: result} on the last line.
python3 - "$OUT" "${RESULTS[@]}" <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
res = {n: json.load(open(f"{out}/{n}.json")) for n in names}
def g(r, *ks):
    for k in ks:
        r = r.get(k) if isinstance(r, dict) else None
    return r
def f(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "-"
rows = [
    ("shared_prefix total s", ("shared_prefix", "total_s"), ".2f"),
    ("shared_prefix mean TTFT s", ("shared_prefix", "mean_ttft_s"), ".3f"),
    ("concurrent output tok/s", ("concurrent", "output_tok_s"), ".1f"),
    ("json valid t=0", ("json", "valid_rate_t0"), ".0%"),
    ("json valid t=0.7", ("json", "valid_rate_t07"), ".0%"),
    ("json constrained tok/s", ("json", "tok_s_constrained"), ".1f"),
    ("json unconstrained tok/s", ("json", "tok_s_unconstrained"), ".1f"),
    ("jump-forward on/off speedup", ("jump_forward", "speedup"), ".2f"),
]
print("| workload | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for label, keys, fmt in rows:
    print(f"| {label} | " + " | ".join(f(g(res[n], *keys), fmt) for n in names) + " |")
print(json.dumps(res))
PY
