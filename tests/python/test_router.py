"""sglrs behind SGLang's own router (`sglang-router==0.3.2`, regular mode), unchanged.

The router adds fields to every body it forwards (`model`, `log_metrics`, … on `/generate`;
`no_stop_trim`, `skip_special_tokens`, … on the OpenAI routes). sglrs accepts them at those
values and answers through the router exactly as it answers directly.

Run:  pip install sglang-router==0.3.2 openai
      SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_router.py
"""

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import openai
import pytest

from test_reliability import Server

pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router==0.3.2)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
