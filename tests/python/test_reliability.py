"""Reliability checks of sglrs with the official `openai` Python client.

Run:  pip install openai
      cargo build --release -p sglrs-runtime --bin sglrs
      python3 tests/python/test_reliability.py      # starts target/release/sglrs itself

Each check starts its own server on 127.0.0.1 with the flags it needs: a full queue answers
503 with Retry-After (and the client's own retries get through once there is room), and
`cache_salt` keeps requests from sharing cached prefixes. Works under pytest as well.
"""

import concurrent.futures
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Server:
    """`sglrs serve` with extra flags on a free port, stopped on exit."""

    def __init__(self, *flags):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        binary = os.environ.get("SGLRS_BIN") or os.path.join(
            os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "sglrs"
        )
        self.proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", str(port), *flags])
        self.base = f"http://127.0.0.1:{port}"
        self.wait_until_up("sglrs serve", 300)

    def wait_until_up(self, what, timeout):
        """Waits until `/health` answers; stops the process and raises if it exits or the
        timeout passes first."""
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2)
                return
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"{what} did not come up")
                time.sleep(0.3)

    def client(self, **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def long_completion(c, tokens):
    return c.completions.create(
        model="default",
        prompt="Tell me a long story about a dragon.",
        max_tokens=tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def test_a_full_queue_is_503_with_retry_after_and_retries_get_through():
    with Server("--max-queued-requests", "1", "--max-running-requests", "1") as s:
        plain = s.client(max_retries=0, timeout=120)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(long_completion, plain, 64) for _ in range(8)]
            done, refused = [], []
            for f in futures:
                try:
                    done.append(f.result())
                except openai.APIStatusError as e:
                    refused.append(e)
        assert done and refused, (len(done), len(refused))
        for e in refused:
            assert e.status_code == 503, e
            assert int(e.response.headers["retry-after"]) >= 1
            assert "overloaded" in str(e)
        assert all(r.usage.completion_tokens == 64 for r in done)
        # The client's own retries (which honour Retry-After) get every request through.
        patient = s.client(max_retries=20, timeout=120)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: long_completion(patient, 8), range(4)))
        assert all(r.usage.completion_tokens == 8 for r in results)


def test_cache_salt_keeps_prefixes_apart():
    with Server() as s:
        c = s.client()
        prompt = "".join(f"Entry {i}: the code is {i * 11 % 97}. " for i in range(40))
        a, b = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"

        def cached(salt):
            r = c.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=1,
                temperature=0,
                extra_body={"cache_salt": salt},
            )
            return r.usage.prompt_tokens_details.cached_tokens

        assert cached(a) == 0
        assert cached(a) > 0
        assert cached(b) == 0


def main():
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            t = time.time()
            try:
                fn()
                print(f"ok   {name} ({time.time() - t:.1f}s)")
            except Exception as e:  # report every failure, then exit non-zero
                failed += 1
                print(f"FAIL {name}: {e!r}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
