"""Clients written for vLLM or llama.cpp, unchanged, with the official `openai` client: their
extension fields are honoured where sglrs has their meaning and refused by name otherwise.

Run:  SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_client_fields.py
"""

import json
import re

import openai
import pytest

from test_reliability import Server


@pytest.fixture(scope="module")
def server():
    with Server("--threads", "2") as s:
        yield s


def complete(c, prompt, **extra):
    return c.completions.create(model="default", prompt=prompt, temperature=0.7, seed=1,
                                max_tokens=40, extra_body=extra).choices[0].text


def test_vllm_guided_decoding_fields(server):
    c = server.client(max_retries=0)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    out = complete(c, "A city as JSON:", guided_json=schema)
    assert isinstance(json.loads(out)["city"], str)
    out = complete(c, "Pick a colour:", guided_choice=["red", "green", "blue (dark)"])
    assert out in ("red", "green", "blue (dark)")
    out = complete(c, "A year:", guided_regex="[12][0-9]{3}")
    assert re.fullmatch("[12][0-9]{3}", out)
    out = complete(c, "Yes or no?", guided_grammar='root ::= "yes" | "no"')
    assert out in ("yes", "no")
    # vLLM's sampling extensions.
    complete(c, "Hello", top_k=20, min_p=0.05, repetition_penalty=1.1, min_tokens=2,
             ignore_eos=False, skip_special_tokens=True)


def test_llama_cpp_fields(server):
    c = server.client(max_retries=0)
    # Load scripts written for llama.cpp send repeat_penalty and n_predict.
    r = c.completions.create(model="default", prompt="Count: 1, 2,", temperature=0,
                             extra_body={"repeat_penalty": 1.0, "n_predict": 5})
    assert r.usage.completion_tokens <= 5
    out = complete(c, "Yes or no?", grammar='root ::= "yes" | "no"')
    assert out in ("yes", "no")
    out = complete(c, "A number as JSON:", json_schema={"type": "object",
                   "properties": {"n": {"type": "integer"}}, "required": ["n"],
                   "additionalProperties": False})
    assert isinstance(json.loads(out)["n"], int)
    complete(c, "Hello", cache_prompt=True)


@pytest.mark.parametrize("extra,name", [
    ({"cache_prompt": False}, "cache_prompt"),
    ({"guided_regex": "a+", "grammar": 'root ::= "a"'}, "guided_regex, grammar"),
    ({"repeat_penalty": 1.2, "repetition_penalty": 1.1}, "repeat_penalty"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": 5}, "guided_json"),
])
def test_fields_that_cannot_be_honoured_are_refused_by_name(server, extra, name):
    c = server.client(max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        complete(c, "Hello", **extra)
    assert name in str(e.value)
    # The chat route takes the same fields.
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=4, extra_body=extra)
    assert name in str(e.value)


def test_streamed_meta_info_counts_output_logprobs_as_sglang_does(server):
    # SGLang's frontend reads `output_token_logprobs_length` from every streamed event.
    import urllib.request
    body = json.dumps({"text": "Count to five:", "stream": True, "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).encode()
    req = urllib.request.Request(server.base + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                events.append(json.loads(line[6:])["meta_info"])
    assert events
    for m in events:
        assert m["output_token_logprobs_length"] == len(m["output_token_logprobs"])
        assert m["output_token_logprobs_length"] == m["completion_tokens"]
    # Every event carries the prompt's token count, the first one included (it read 0
    # until the last event).
    assert len({m["prompt_tokens"] for m in events}) == 1
    assert events[0]["prompt_tokens"] > 0


def test_limits_and_stops_are_honoured_or_refused_by_name(server):
    c = server.client(max_retries=0)
    hi = [{"role": "user", "content": "Count to twenty."}]
    # OpenAI's new name for the limit is honoured; the deprecated one beside it must agree.
    r = c.chat.completions.create(model="default", messages=hi, temperature=0,
                                  max_completion_tokens=3)
    assert r.usage.completion_tokens <= 3
    r = c.chat.completions.create(model="default", messages=hi, temperature=0,
                                  max_completion_tokens=3, max_tokens=3)
    assert r.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="default", messages=hi, max_completion_tokens=3,
                                  max_tokens=50)
    assert "max_completion_tokens" in str(e.value) and "max_tokens" in str(e.value)
    # An empty stop string would end every output at once; it used to be dropped silently.
    for route in ("chat", "completions"):
        with pytest.raises(openai.BadRequestError) as e:
            if route == "chat":
                c.chat.completions.create(model="default", messages=hi, max_tokens=4,
                                          stop=["ok", ""])
            else:
                c.completions.create(model="default", prompt="Hi", max_tokens=4, stop="")
        assert "stop" in str(e.value) and "empty" in str(e.value)
