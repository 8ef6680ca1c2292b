"""Soak: a bounded mixed load against one server, then a check that nothing leaked.

Run:  SGLRS_BIN=$CARGO_TARGET_DIR/release/sglrs python3 -m pytest -q -s tests/python/test_soak.py
      SOAK_SECONDS=600 ... (`make soak`; the suite runs 180 s)

One server with the default model, default limits and a 128 MiB KV pool (the cache evicts
throughout). `WORKERS` clients in closed loops send,
at random (seeded), plain, streamed, `n = 2`, JSON-schema constrained and logprob
`/generate` requests; about 10% carry a `rid` and are aborted with `/abort_request` while
they run, and about 10% are streams whose client closes the connection after the first
event. The server's RSS, file descriptors, threads and `internal_states[0]` are sampled
every second. At the end: no request lost, every answer well formed, and once idle and
flushed every page free, no lock and no rid held, descriptors and threads back to their
baseline, and RSS growth after warm-up under 1 MiB per 1,000 requests (runs of 10 minutes;
under 32 MiB in all for shorter ones).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid

from loadkit import (
    Outcome,
    Sampler,
    flush_cache,
    post_json,
    proc_sample,
    report,
    server_info,
    stream_generate,
    wait_idle,
)
from test_reliability import Server

SECONDS = float(os.environ.get("SOAK_SECONDS", "180"))
WORKERS = 8
WARMUP_FRACTION = 0.2
# A small KV pool (~360 pages): the radix cache fills it within the warm-up, so the load runs
# under constant eviction, and the pool's memory is all touched before RSS is measured (the
# pool is mapped up front and enters RSS page by page as the cache first uses it: with the
# default 1 GiB pool that first touch, not a leak, dominates RSS for a long while).
KV_MEMORY_MB = 128
# RSS rises by ~20 MiB over the first ~5 minutes of load on the 2-core box (allocator arenas
# and caches reaching their working size) and is flat after, so the per-request bound
# (< 1 MiB per 1,000 requests after warm-up) is asserted on runs of 10 minutes (`make soak`);
# shorter ones (the suite's 3 minutes) assert the growth after warm-up stays under
# SHORT_RUN_RSS_MIB in all.
LONG_RUN = 600
SHORT_RUN_RSS_MIB = 32
PROMPTS = [
    "Tell me a story about a dragon.",
    "List three colours.",
    "What is the capital of France?",
    "Write a short poem about the sea.",
]
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
]
# Kind and weight; "abort" and "leave" are about 10% each.
KINDS = [("plain", 20), ("stream", 20), ("n2", 15), ("json", 15), ("logprob", 10), ("abort", 10), ("leave", 10)]


def params(rng: random.Random, tokens: int) -> dict:
    return {"max_new_tokens": tokens, "temperature": rng.choice([0, 0.7]), "ignore_eos": True}


def one_request(base: str, kind: str, rng: random.Random) -> tuple[Outcome, str]:
    """Sends one request of `kind`; returns its outcome and "" or what was wrong with the
    answer."""
    text = rng.choice(PROMPTS)
    tokens = rng.randint(4, 24)
    if kind == "plain":
        o = post_json(base, "/generate", {"text": text, "sampling_params": params(rng, tokens)})
        bad = o.kind == "ok" and o.body["meta_info"]["completion_tokens"] != tokens
        return o, "wrong completion_tokens" if bad else ""
    if kind == "stream":
        return stream_generate(base, {"text": text, "sampling_params": params(rng, tokens)}), ""
    if kind == "n2":
        o = post_json(base, "/generate", {"text": text, "sampling_params": {**params(rng, tokens), "n": 2}})
        bad = o.kind == "ok" and not (isinstance(o.body, list) and len(o.body) == 2)
        return o, "not two samples" if bad else ""
    if kind == "json":
        schema = rng.choice(SCHEMAS)
        sp = {"max_new_tokens": 48, "temperature": 0.7, "json_schema": json.dumps(schema)}
        o = post_json(base, "/generate", {"text": "Answer in JSON. " + text, "sampling_params": sp})
        if o.kind == "ok" and o.finish == "stop":
            try:
                v = json.loads(o.body["text"])
            except ValueError:
                return o, f"not JSON: {o.body['text']!r}"
            if not isinstance(v, dict if schema["type"] == "object" else list):
                return o, f"wrong type: {o.body['text']!r}"
        return o, ""
    if kind == "logprob":
        o = post_json(
            base, "/generate", {"text": text, "sampling_params": params(rng, tokens), "return_logprob": True}
        )
        bad = o.kind == "ok" and len(o.body["meta_info"]["output_token_logprobs"]) != tokens
        return o, "wrong number of logprobs" if bad else ""
    if kind == "abort":
        rid = f"soak-{uuid.uuid4()}"
        body = {"text": text, "sampling_params": params(rng, 64), "rid": rid}
        timer = threading.Timer(
            rng.uniform(0.02, 0.4), lambda: post_json(base, "/abort_request", {"rid": rid}, timeout=30)
        )
        timer.start()
        o = stream_generate(base, body) if rng.random() < 0.5 else post_json(base, "/generate", body)
        timer.join(timeout=35)
        return o, ""
    assert kind == "leave"
    return stream_generate(base, {"text": text, "sampling_params": params(rng, 64)}, leave_after_first=True), ""


def test_a_mixed_load_leaks_nothing():
    with Server("--kv-memory-mb", str(KV_MEMORY_MB)) as s:
        pid = s.proc.pid
        rng = random.Random(20261202)
        # Fill the pool with distinct prompts until the cache evicts: every page touched.
        for i in range(200):
            if server_info(s.base)["cache"]["evicted_pages"] > 0:
                break
            words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(150))
            fill = {"text": words, "sampling_params": {"max_new_tokens": 1}}
            assert post_json(s.base, "/generate", fill).kind == "ok"
        assert server_info(s.base)["cache"]["evicted_pages"] > 0, "the warm-up never filled the KV pool"
        for kind, _ in KINDS:  # warm-up: one of each (compiles the grammars once)
            for _ in range(2):
                one_request(s.base, kind, rng)
        for schema in SCHEMAS:
            sp = {"max_new_tokens": 2, "json_schema": json.dumps(schema)}
            post_json(s.base, "/generate", {"text": "x", "sampling_params": sp})
        wait_idle(s.base)
        assert flush_cache(s.base)
        base = proc_sample(pid, 0)
        total_pages = server_info(s.base)["cache"]["total_pages"]

        done: list[tuple[float, str, Outcome, str]] = []
        lock = threading.Lock()
        sampler = Sampler(s.base, pid, 1.0)
        t0 = sampler.t0
        stop_at = t0 + SECONDS
        sampler.start()

        def worker(seed: int) -> None:
            wrng = random.Random(seed)
            names = [k for k, _ in KINDS]
            weights = [w for _, w in KINDS]
            while time.monotonic() < stop_at:
                kind = wrng.choices(names, weights)[0]
                o, bad = one_request(s.base, kind, wrng)
                with lock:
                    done.append((time.monotonic() - t0, kind, o, bad))

        workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(WORKERS)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=SECONDS + 180)
        assert not any(w.is_alive() for w in workers), "a client did not finish within 180 s of the end"
        sampler.stop()
        load_seconds = time.monotonic() - t0
        first_lost = next((t for t, _, o, _ in done if o.kind == "lost"), None)
        assert s.proc.poll() is None, (
            f"the server exited with {s.proc.returncode} during the load "
            f"(first lost request at {first_lost} s of {load_seconds:.0f} s)"
        )

        idle = wait_idle(s.base)
        flushed = flush_cache(s.base)
        after = server_info(s.base)
        # Descriptors and threads: the runtime's idle blocking threads leave after ~10 s.
        deadline = time.monotonic() + 30
        while True:
            end = proc_sample(pid, 0)
            if (end.fds <= base.fds + 2 and end.threads <= base.threads + 2) or time.monotonic() > deadline:
                break
            time.sleep(0.5)

        by_kind: dict[str, int] = {}
        for _, kind, o, _ in done:
            by_kind[kind] = by_kind.get(kind, 0) + 1
        lost = [(k, o) for _, k, o, _ in done if o.kind == "lost"]
        errors = [(k, o) for _, k, o, _ in done if o.kind == "error"]
        bad = [(k, b) for _, k, _, b in done if b]
        aborted = sum(1 for _, k, o, _ in done if k == "abort" and o.finish == "abort")
        left = sum(1 for _, _, o, _ in done if o.kind == "disconnected")

        procs = [p for p, _ in sampler.samples]
        warm = [p for p in procs if p.t >= WARMUP_FRACTION * SECONDS]
        rss_warm, rss_end = warm[0], warm[-1]
        served_after_warm = sum(1 for t, _, _, _ in done if rss_warm.t <= t <= rss_end.t)
        growth_per_1000 = (rss_end.rss_kib - rss_warm.rss_kib) / 1024 / max(served_after_warm, 1) * 1000
        states = [st for _, st in sampler.samples]
        figures = {
            "seconds": round(load_seconds, 1),
            "requests": len(done),
            "by_kind": by_kind,
            "aborted_by_rid": aborted,
            "disconnected": left,
            "lost": len(lost),
            "errors": len(errors),
            "malformed": len(bad),
            "rss_mib_baseline": round(base.rss_kib / 1024, 1),
            "rss_mib_at_warm": round(rss_warm.rss_kib / 1024, 1),
            "rss_mib_max": round(max(p.rss_kib for p in procs) / 1024, 1),
            "rss_mib_end": round(rss_end.rss_kib / 1024, 1),
            "rss_curve_mib": [round(p.rss_kib / 1024, 1) for p in procs[:: max(1, len(procs) // 10)]],
            "requests_after_warm": served_after_warm,
            "rss_growth_mib_per_1000": round(growth_per_1000, 3),
            "fds_baseline_max_end": [base.fds, max(p.fds for p in procs), end.fds],
            "threads_baseline_max_end": [base.threads, max(p.threads for p in procs), end.threads],
            "max_running": max(st["num_running_reqs"] for st in states),
            "max_waiting": max(st["num_waiting_reqs"] for st in states),
            "max_queued": max(st["queued_requests"] for st in states),
            "max_rids_in_flight": max(st["rids_in_flight"] for st in states),
            "max_held_locks": max(st["cache"]["held_locks"] for st in states),
            "evicted_pages": after["cache"]["evicted_pages"],
            "min_free_pages": min(st["cache"]["free_pages"] for st in states),
            "total_pages": total_pages,
            "after_flush": {k: after["cache"][k] for k in ("free_pages", "running_pages", "tree_pages", "held_locks")},
            "cache_internal_errors": after["cache"]["internal_errors"],
        }
        report("soak", figures)

        assert not lost, lost[:5]
        assert not errors, errors[:5]
        assert not bad, bad[:5]
        assert all(by_kind.get(k, 0) > 0 for k, _ in KINDS), by_kind
        assert aborted > 0, "no abort by rid took effect"
        assert idle["rids_in_flight"] == 0 and idle["queued_requests"] == 0, idle
        assert flushed, "/flush_cache never succeeded"
        assert after["cache"]["free_pages"] == after["cache"]["total_pages"] == total_pages, after["cache"]
        assert after["cache"]["held_locks"] == 0 and after["cache"]["internal_errors"] == 0, after["cache"]
        assert after["rids_in_flight"] == 0, after
        assert end.fds <= base.fds + 2, figures
        assert end.threads <= base.threads + 2, figures
        if SECONDS >= LONG_RUN:
            assert growth_per_1000 < 1.0, figures
        else:
            # Shorter runs end inside the allocator's ramp (see LONG_RUN): bound the total.
            assert (rss_end.rss_kib - rss_warm.rss_kib) / 1024 < SHORT_RUN_RSS_MIB, figures
