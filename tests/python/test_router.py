"""sglrs behind SGLang's own router (`sglang-router==0.3.2`, regular mode), unchanged.

The router adds fields to every body it forwards (`model`, `log_metrics`, … on `/generate`;
`no_stop_trim`, `skip_special_tokens`, … on the OpenAI routes). sglrs accepts them at those
values and answers through the router exactly as it answers directly.

Run:  pip install sglang-router==0.3.2 openai
      SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_router.py
"""

import concurrent.futures
import json
import subprocess
import sys
import urllib.error
import urllib.request

import openai
import pytest

from test_reliability import Server
from test_pd import free_port

pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router==0.3.2)")


class Router(Server):
    """`python -m sglang_router.launch_router` in regular mode over the given workers
    (stopped like a server)."""

    def __init__(self, *workers, policy="cache_aware"):
        port, metrics = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--policy", policy, "--prometheus-port", str(metrics),
             "--worker-urls", *workers],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{port}"
        self.wait_until_up("sglang-router", 120)


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_generate_and_openai_routes_answer_through_the_router_as_directly():
    with Server("--threads", "2") as s, Router(s.base) as r:
        body = {"text": "The capital of France is",
                "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        direct = post(s.base, "/generate", body)
        routed = post(r.base, "/generate", body)
        assert direct[0] == 200 and routed[0] == 200, (direct, routed)
        assert routed[1]["text"] == direct[1]["text"]
        assert routed[1]["output_ids"] == direct[1]["output_ids"]

        client = openai.OpenAI(base_url=r.base + "/v1", api_key="none", max_retries=0)
        direct_client = s.client(max_retries=0)
        kw = dict(model="default", prompt="The capital of Germany is", max_tokens=8, temperature=0)
        assert client.completions.create(**kw).choices[0].text == \
            direct_client.completions.create(**kw).choices[0].text
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
        assert streamed == direct_client.completions.create(**kw).choices[0].text

        msgs = [{"role": "user", "content": "Name one colour."}]
        chat = client.chat.completions.create(model="default", messages=msgs, max_tokens=8, temperature=0)
        want = direct_client.chat.completions.create(model="default", messages=msgs, max_tokens=8, temperature=0)
        assert chat.choices[0].message.content == want.choices[0].message.content


def test_extension_fields_that_ask_for_something_unsupported_are_refused_by_name():
    with Server("--threads", "2") as s:
        for path, body, name in [
            ("/generate", {"text": "hi", "return_hidden_states": True}, "return_hidden_states"),
            ("/generate", {"text": "hi", "log_metrics": False}, "log_metrics"),
            ("/generate", {"text": "hi", "model": "another-model"}, "another-model"),
            ("/v1/completions", {"prompt": "hi", "return_hidden_states": True}, "return_hidden_states"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                      "continue_final_message": True}, "continue_final_message"),
        ]:
            status, err = post(s.base, path, body)
            assert status in (400, 404), (path, body, status, err)
            assert name in err["error"]["message"], (path, body, err)
        # At their defaults they are accepted, as the router sends them.
        status, out = post(s.base, "/generate", {
            "text": "hi", "model": None, "log_metrics": True, "no_logs": False,
            "return_hidden_states": False, "background": False, "return_bytes": False,
            "return_entropy": False, "sampling_params": {"max_new_tokens": 2}})
        assert status == 200, out


def _counters(base: str) -> tuple[int, int]:
    """(prompt_tokens, cached_tokens) the replica counted itself."""
    with urllib.request.urlopen(base + "/get_server_info", timeout=30) as r:
        st = json.loads(r.read())["internal_states"][0]
    return st["prompt_tokens"], st["cached_tokens"]


def _run_workload(router_base: str, docs: list[str], questions: int) -> None:
    # Documents interleaved (d0 q0, d1 q0, d2 q0, d0 q1, …), two in flight: with three
    # documents over two replicas, round_robin sends each document to both.
    bodies = [{"text": f"{docs[i % len(docs)]}\nQuestion {i // len(docs)}: what is line {i}?\nAnswer:",
               "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
              for i in range(len(docs) * questions)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for status, out in pool.map(lambda b: post(router_base, "/generate", b), bodies):
            assert status == 200, out


def test_cache_aware_over_two_replicas_hits_more_than_round_robin() -> None:
    docs = ["".join(f"Document {d}, line {i}: the {['red', 'green', 'blue'][d]} item number "
                    f"{i * 7 + d} is stored here. " for i in range(40)) for d in range(3)]
    with Server("--threads", "1") as a, Server("--threads", "1") as b:
        rates: dict[str, float] = {}
        for policy in ("round_robin", "cache_aware"):
            for s in (a, b):  # each policy starts from empty caches
                req = urllib.request.Request(s.base + "/flush_cache", data=b"", method="POST")
                with urllib.request.urlopen(req, timeout=30) as resp:
                    assert resp.status == 200
            before = [_counters(s.base) for s in (a, b)]
            with Router(a.base, b.base, policy=policy) as r:
                _run_workload(r.base, docs, 5)
                # What the router polls answers as it expects: both workers healthy, and
                # /get_load parsed (the router reports -1 for a load it could not read).
                with urllib.request.urlopen(r.base + "/get_loads", timeout=30) as resp:
                    loads = json.loads(resp.read())["workers"]
                assert sorted(w["worker"] for w in loads) == sorted([a.base, b.base]), loads
                assert all(w["load"] >= 0 for w in loads), loads
            after = [_counters(s.base) for s in (a, b)]
            prompt = [x[0] - y[0] for x, y in zip(after, before)]
            cached = [x[1] - y[1] for x, y in zip(after, before)]
            assert all(p > 0 for p in prompt), (policy, prompt)  # both replicas got work
            rates[policy] = sum(cached) / sum(prompt)
        print("hit rates", rates)
        assert rates["cache_aware"] > rates["round_robin"] + 0.1, rates
