"""Fork-heavy program benchmark: in-process Engine vs HTTP, and SGLang's frontend over HTTP.

The program: one ~500-token prefix, forked into 4 branches that each generate 32 tokens,
each branch forked again into 4 that each generate 32 tokens (2 levels, 20 generations of 32
tokens, all at temperature 0 with `ignore_eos`). Every run starts with a prefix no earlier run
shared, so each mode computes the same work. Modes, all in the same invocation:

- ``engine``: ``sgl.Engine`` — the Rust runtime inside this process (needs the native Engine);
- ``http``: ``sgl.RuntimeEndpoint`` on an ``sglrs serve`` process (started here, or ``--url``);
- ``sglang``: SGLang's frontend (``import sglang as sgl``) from ``--sglang-python``, against the
  same server.

Usage::

    python -m sglrs.bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --server-bin target/release/sglrs [--sglang-python /tmp/sglfront/bin/python] [--json]

The file has no imports from sglrs at module level, so SGLang's interpreter runs it as a
worker (``python bench.py --worker URL RUNS``) without sglrs installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

WORDS = (
    "river mountain garden window silver morning quiet market letter engine harbor forest "
    "candle winter bridge yellow student kitchen travel ocean pencil thunder orange village "
    "library summer castle rabbit doctor planet basket mirror copper island shadow meadow"
).split()

BRANCHES = 4
GEN_TOKENS = 32


def make_prefix(run_id: int, n_words: int = 396) -> str:
    """A deterministic ~500-token prefix whose first tokens differ for every `run_id`."""
    words = [WORDS[(i * 7 + run_id * 13 + i // 5) % len(WORDS)] for i in range(n_words)]
    lines = [" ".join(words[i : i + 11]) + "." for i in range(0, n_words, 11)]
    return f"Session {run_id:05d} notes.\n" + "\n".join(lines) + "\nIdeas:\n"


def build_program(sgl: Any) -> Any:
    """The fork-heavy program, written against a frontend module (`sglrs` or `sglang`)."""

    @sgl.function  # type: ignore[untyped-decorator]
    def fork_tree(s: Any, prefix: str) -> None:
        s += prefix
        level1 = s.fork(BRANCHES)
        for i, b in enumerate(level1):
            b += f"Idea {i + 1}:"
            b += sgl.gen("l1", max_tokens=GEN_TOKENS, temperature=0, ignore_eos=True)
        level2s = []
        for b in level1:
            # forking waits for this branch's own generation; the others keep running
            level2 = b.fork(BRANCHES)
            for j, c in enumerate(level2):
                c += f"\nDetail {j + 1}:"
                c += sgl.gen("l2", max_tokens=GEN_TOKENS, temperature=0, ignore_eos=True)
            level2s.append(level2)
        for level2 in level2s:
            level2.join()
        level1.join()

    return fork_tree


def outputs(st: Any) -> str:
    """Everything the program generated (level-1 and level-2 texts), as JSON."""
    return json.dumps({"l1": st["l1"], "l2": st["l2"]}, sort_keys=True)


def one_run(program: Any, backend: Any, run_id: int) -> "tuple[float, str]":
    """Seconds for one program run on a fresh prefix, and its outputs."""
    t = time.perf_counter()
    st = program.run(prefix=make_prefix(run_id), backend=backend)
    st.sync()
    _ = st.text()
    took = time.perf_counter() - t
    err = st.error() if hasattr(st, "error") else None
    if err is not None:
        raise RuntimeError(f"benchmark program failed: {err}")
    return took, outputs(st)


def time_runs(
    program: Any, backend: Any, runs: int, first_run_id: int
) -> "tuple[List[float], List[str]]":
    """Seconds per program run (one warm-up run first, not counted) and each run's outputs."""
    times: List[float] = []
    outs: List[str] = []
    for k in range(runs + 1):
        took, out = one_run(program, backend, first_run_id + k)
        if k > 0:
            times.append(took)
            outs.append(out)
    return times, outs


def forward_stats(backend: Any) -> Dict[str, float]:
    """The scheduler's forward-pass counters (sglrs backends)."""
    info = backend.get_server_info()
    st = (info.get("internal_states") or [{}])[0]
    return {k: float(st.get(k, 0)) for k in ("forward_passes", "forward_tokens", "forward_seconds")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(binary: str, model: str) -> "tuple[subprocess.Popen[bytes], str, Any]":
    """Start ``sglrs serve`` on a free loopback port and wait for /health."""
    import requests

    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="sglrs-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sglrs serve exited ({proc.returncode}); log: {log.name}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except requests.RequestException:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"sglrs serve did not come up; log: {log.name}")


def _summary(times: List[float], fwd: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "runs": float(len(times)),
        "times_s": times,
    }
    if fwd is not None:
        # per timed run: forward passes, tokens through the model, and seconds in them
        out["forward_per_run"] = {k: v / len(times) for k, v in fwd.items()}
        out["forward_share_of_wall"] = fwd["forward_seconds"] / sum(times)
    return out


def _delta(a: Dict[str, float], b: Dict[str, float], acc: Dict[str, float]) -> None:
    for k in a:
        acc[k] = acc.get(k, 0.0) + b[k] - a[k]


def worker_main(argv: List[str]) -> None:
    """``--worker URL RUNS FIRST_ID MODULE``: time the program under a frontend, print JSON."""
    url, runs, first_id, module = argv[0], int(argv[1]), int(argv[2]), argv[3]
    sgl = importlib.import_module(module)
    backend = sgl.RuntimeEndpoint(url)
    times, outs = time_runs(build_program(sgl), backend, runs, first_id)
    print(json.dumps({"times": times, "outputs": outs}))


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark; prints a table (or one JSON object with ``--json``)."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in and args_in[0] == "--worker":
        worker_main(args_in[1:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m sglrs.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("SGLRS_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--server-bin", default=os.environ.get("SGLRS_BIN"))
    ap.add_argument("--url", help="use a running sglrs server instead of starting one")
    ap.add_argument("--sglang-python", default=os.environ.get("SGLANG_PYTHON"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mode-timeout", type=int, default=600,
                    help="seconds before the SGLang-frontend worker is given up")
    args = ap.parse_args(args_in)

    import sglrs as sgl

    results: Dict[str, Any] = {"program": {
        "prefix_tokens_approx": 500, "branches": BRANCHES, "levels": 2, "gen_tokens": GEN_TOKENS}}
    program = build_program(sgl)
    # Every mode runs the same prefixes, each on a cold cache of its own (the in-process
    # engine has its own; the server's is flushed before the SGLang frontend's turn), so the
    # work is the same and the greedy outputs must be equal.
    run_id = int(time.time()) % 50000 * 10
    warm_id, timed_ids = run_id, [run_id + 1 + k for k in range(args.runs)]

    engine = None
    if hasattr(sgl, "Engine"):
        engine = sgl.Engine(model_path=args.model)
    else:
        results["engine"] = {"skipped": "this build has no in-process Engine"}

    proc = None
    log = None
    url = args.url
    outs: Dict[str, List[str]] = {}
    try:
        if url is None:
            if not args.server_bin:
                raise SystemExit("give --server-bin (or SGLRS_BIN) or --url")
            proc, url, log = start_server(args.server_bin, args.model)
        http = sgl.RuntimeEndpoint(url)
        modes: List[Any] = ([("engine", engine)] if engine is not None else []) + [("http", http)]
        for _, backend in modes:
            one_run(program, backend, warm_id)  # warm-up, not counted
        times: Dict[str, List[float]] = {name: [] for name, _ in modes}
        fwd: Dict[str, Dict[str, float]] = {name: {} for name, _ in modes}
        for name, _ in modes:
            outs[name] = []
        # Interleaved (engine, http, engine, http, ...) so that load changes hit both alike.
        for rid in timed_ids:
            for name, backend in modes:
                a = forward_stats(backend)
                took, out = one_run(program, backend, rid)
                _delta(a, forward_stats(backend), fwd[name])
                times[name].append(took)
                outs[name].append(out)
        for name, _ in modes:
            results[name] = _summary(times[name], fwd[name])
        if engine is not None:
            engine.shutdown()
            engine = None
        if args.sglang_python:
            http.flush_cache()  # the SGLang frontend's runs start on a cold cache too
            r: Optional["subprocess.CompletedProcess[str]"] = None
            try:
                r = subprocess.run(
                    [args.sglang_python, os.path.abspath(__file__), "--worker", url,
                     str(args.runs), str(warm_id), "sglang"],
                    capture_output=True, text=True, timeout=args.mode_timeout,
                )
            except subprocess.TimeoutExpired as exc:
                tail = exc.stderr[-2000:] if isinstance(exc.stderr, str) else ""
                results["sglang"] = {"error": f"timed out after {args.mode_timeout} s: {tail}"}
            if r is not None and r.returncode != 0:
                results["sglang"] = {"error": r.stderr[-2000:]}
            elif r is not None:
                got = json.loads(r.stdout.strip().splitlines()[-1])
                results["sglang"] = _summary(got["times"])
                outs["sglang"] = got["outputs"]
        else:
            results["sglang"] = {"skipped": "no --sglang-python"}
    finally:
        if engine is not None:
            engine.shutdown()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if log is not None:
            os.unlink(log.name)

    # Same program, same prefixes, temperature 0: every mode must generate the same texts.
    names = list(outs)
    same = all(outs[n] == outs[names[0]] for n in names)
    results["outputs_equal"] = {"modes": names, "equal": same}
    if not same:
        for n in names:
            results[n]["outputs"] = outs[n]

    def med(k: str) -> Optional[float]:
        v = results.get(k, {})
        return float(v["median_s"]) if "median_s" in v else None

    ratios: Dict[str, float] = {}
    e, h, g = med("engine"), med("http"), med("sglang")
    if e and h:
        ratios["http_over_engine"] = h / e
    if h and g:
        ratios["sglang_frontend_over_sglrs_http"] = g / h
    if e and g:
        ratios["sglang_frontend_over_engine"] = g / e
    results["ratios"] = ratios
    if args.json:
        print(json.dumps(results))
    else:
        print(f"fork tree: ~500-token prefix, {BRANCHES}x{BRANCHES} branches, "
              f"{GEN_TOKENS} tokens each, median of {args.runs} runs")
        for k in ("engine", "http", "sglang"):
            v = results[k]
            shown = f"{v['median_s']:.3f} s (min {v['min_s']:.3f})" if "median_s" in v else str(v)
            if "forward_per_run" in v:
                f = v["forward_per_run"]
                shown += (f"; {f['forward_passes']:.0f} forward passes, "
                          f"{f['forward_tokens']:.0f} tokens, {f['forward_seconds']:.3f} s in "
                          f"them ({100 * v['forward_share_of_wall']:.0f}% of wall)")
            print(f"  {k:8s} {shown}")
        for k, v in ratios.items():
            print(f"  {k}: {v:.2f}x")
        print(f"  outputs equal across {', '.join(names)}: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
