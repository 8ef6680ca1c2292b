"""Raw-HTTP load tools for the overload and soak tests (`test_overload.py`, `test_soak.py`).

Plain `http.client`, one connection per request, so that a test controls exactly when a
connection opens and closes (a client that leaves mid-stream closes its socket), and every
request ends in one `Outcome`: a result, an explicit HTTP error, a disconnect the test chose,
or `lost` (the connection failed, timed out, or a stream ended without its final event).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import threading
import time
import urllib.request
from typing import Any, Optional

# One request never waits longer than this (seconds) for a byte: past it, it is lost.
REQUEST_TIMEOUT = 120.0


@dataclasses.dataclass
class Outcome:
    """How one request ended."""

    kind: str  # "ok" | "error" | "disconnected" | "lost"
    status: int = 0
    latency: float = 0.0  # seconds from send to the end (or to the error's answer)
    ttft: Optional[float] = None  # seconds from send to the first streamed tokens
    retry_after: Optional[str] = None
    error_type: Optional[str] = None
    finish: Optional[str] = None  # finish_reason.type of the (first) result
    detail: str = ""
    body: Any = None


def _split(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def _error_outcome(status: int, headers: http.client.HTTPMessage, raw: bytes, t0: float) -> Outcome:
    try:
        err = json.loads(raw).get("error", {})
    except (ValueError, AttributeError):
        err = {}
    return Outcome(
        "error",
        status,
        time.monotonic() - t0,
        retry_after=headers.get("Retry-After"),
        error_type=err.get("type") if isinstance(err, dict) else None,
        detail=raw[:200].decode(errors="replace"),
    )


def _finish_of(v: Any) -> Optional[str]:
    first = v[0] if isinstance(v, list) and v else v
    if not isinstance(first, dict):
        return None
    fr = first.get("meta_info", {}).get("finish_reason")
    return fr.get("type") if isinstance(fr, dict) else None


def post_json(base: str, path: str, body: dict, timeout: float = REQUEST_TIMEOUT) -> Outcome:
    """POST `body`, read the whole answer."""
    host, port = _split(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        if r.status != 200:
            return _error_outcome(r.status, r.headers, raw, t0)
        v = json.loads(raw)
        return Outcome("ok", 200, time.monotonic() - t0, finish=_finish_of(v), body=v)
    except Exception as e:  # any transport failure is a lost request
        return Outcome("lost", latency=time.monotonic() - t0, detail=repr(e))
    finally:
        conn.close()


def stream_generate(
    base: str, body: dict, leave_after_first: bool = False, timeout: float = REQUEST_TIMEOUT
) -> Outcome:
    """A streamed `/generate`: records the time to the first event with tokens, and reads
    until `data: [DONE]`. With `leave_after_first` the client closes its socket after the
    first event (`disconnected`)."""
    host, port = _split(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return _error_outcome(r.status, r.headers, r.read(), t0)
        ttft: Optional[float] = None
        last: Any = None
        while True:
            line = r.readline()
            if not line:
                return Outcome("lost", 200, time.monotonic() - t0, ttft, detail="stream ended without [DONE]")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return Outcome("ok", 200, time.monotonic() - t0, ttft, finish=_finish_of(last), body=last)
            last = json.loads(data)
            if ttft is None and last.get("output_ids"):
                ttft = time.monotonic() - t0
                if leave_after_first:
                    return Outcome("disconnected", 200, time.monotonic() - t0, ttft)
    except Exception as e:
        return Outcome("lost", latency=time.monotonic() - t0, detail=repr(e))
    finally:
        conn.close()


def server_info(base: str) -> dict:
    with urllib.request.urlopen(base + "/get_server_info", timeout=10) as r:
        return json.loads(r.read())["internal_states"][0]


def flush_cache(base: str, within: float = 30.0) -> bool:
    """`POST /flush_cache` until it answers 200 (it refuses while requests run), bounded."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        host, port = _split(base)
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request("POST", "/flush_cache")
            r = conn.getresponse()
            r.read()  # "Cache flushed." (200) or "Cache not flushed: ..." (400)
            if r.status == 200:
                return True
        finally:
            conn.close()
        time.sleep(0.2)
    return False


def wait_idle(base: str, within: float = 60.0) -> dict:
    """Waits (bounded) until nothing runs, waits or is queued and no rid is held; returns
    the last `internal_states[0]`."""
    deadline = time.monotonic() + within
    while True:
        s = server_info(base)
        idle = (
            s["num_running_reqs"] == 0
            and s["num_waiting_reqs"] == 0
            and s["queued_requests"] == 0
            and s["rids_in_flight"] == 0
        )
        if idle or time.monotonic() > deadline:
            return s
        time.sleep(0.2)


@dataclasses.dataclass
class ProcSample:
    t: float
    rss_kib: int
    threads: int
    fds: int


def proc_sample(pid: int, t0: float) -> ProcSample:
    """RSS (VmRSS), threads and open file descriptors of process `pid`."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return ProcSample(time.monotonic() - t0, rss, threads, len(os.listdir(f"/proc/{pid}/fd")))


class Sampler(threading.Thread):
    """Samples the server process and its `internal_states[0]` every `period` seconds
    until `stop()`."""

    def __init__(self, base: str, pid: int, period: float = 1.0):
        super().__init__(daemon=True)
        self.base, self.pid, self.period = base, pid, period
        self.t0 = time.monotonic()
        self.samples: list[tuple[ProcSample, dict]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.append((proc_sample(self.pid, self.t0), server_info(self.base)))
            except Exception:  # a slow /get_server_info under load: skip this sample
                pass
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def report(name: str, figures: dict) -> None:
    """Prints the figures and, with `$SGLRS_LOAD_REPORT_DIR` set, writes them as JSON."""
    print(f"{name}: {json.dumps(figures, indent=1)}")
    d = os.environ.get("SGLRS_LOAD_REPORT_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{name}.json"), "w") as f:
            json.dump(figures, f, indent=1)
