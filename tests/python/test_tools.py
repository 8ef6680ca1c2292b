"""Tool calling through the official `openai` client, against the real model: every
`tool_choice` mode, `parallel_tool_calls`, streamed tool-call deltas reassembled, and an agent
loop with `tool` messages. Every call the server returns must validate against its
function's schema.

Run:  SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_tools.py
"""

import json
import urllib.request

import jsonschema
import openai
import pytest

from test_reliability import Server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "maxLength": 30}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What's the weather in Paris and in Tokyo?"}]


@pytest.fixture(scope="module")
def server():
    with Server("--threads", "2") as s:
        yield s


def token_ids(server, text):
    """The model's token ids of `text` (through the native API's prompt logprobs)."""
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1},
                       "return_logprob": True, "logprob_start_len": 0}).encode()
    req = urllib.request.Request(server.base + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return [t[1] for t in json.load(r)["meta_info"]["input_token_logprobs"]]


def check_calls(calls):
    """Every call names a tool and its arguments validate against that tool's schema."""
    for c in calls:
        assert c.type == "function" and c.id
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def chat(server, **kw):
    args = dict(model="default", messages=QUESTION, tools=TOOLS, max_tokens=100, temperature=0)
    args.update(kw)
    return server.client(max_retries=0).chat.completions.create(**args)


def test_none_answers_in_text_without_the_tools_in_the_prompt(server):
    r = chat(server, tool_choice="none", max_tokens=20)
    m = r.choices[0].message
    assert m.tool_calls is None and m.content
    with_tools = chat(server, tool_choice="auto", max_tokens=1)
    assert r.usage.prompt_tokens < with_tools.usage.prompt_tokens


def test_auto_answers_in_text_or_calls_and_a_started_call_is_enforced(server):
    # At T=0 this model answers the question in text.
    r = chat(server, tool_choice="auto")
    m = r.choices[0].message
    assert not m.tool_calls and m.content and "<tool_call>" not in m.content
    # Pushed towards the call syntax (and towards '_' in the arguments), it calls a tool,
    # and the call stays valid: once `<tool_call>` appears, the rest is enforced.
    bias = {str(t): 8 for t in token_ids(server, "<tool_call>")}
    for seed in range(3):
        r = chat(server, tool_choice="auto", temperature=0.8, seed=seed, logit_bias=bias)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.tool_calls
        check_calls(c.message.tool_calls)


def test_required_calls_and_parallel_tool_calls(server):
    # The model closes its call list after one call; a bias against the closing bracket
    # keeps it calling, so parallel calls happen, and all of them validate.
    no_close = {str(t): -100 for t in token_ids(server, "]") + token_ids(server, "}]")}
    r = chat(server, tool_choice="required", parallel_tool_calls=True, logit_bias=no_close)
    calls = r.choices[0].message.tool_calls
    complete = [c for c in calls if c.function.arguments.endswith("}")]
    assert len(complete) >= 2, calls
    check_calls(complete)
    # parallel_tool_calls false: exactly one call, whatever the bias.
    for bias in (None, no_close):
        r = chat(server, tool_choice="required", parallel_tool_calls=False, logit_bias=bias)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
        check_calls(c.message.tool_calls)
        assert c.message.content is None


def test_named_tool_choice_calls_that_function(server):
    for temperature in (0.0, 1.0):
        r = chat(server, tool_choice={"type": "function", "function": {"name": "get_time"}},
                 temperature=temperature, seed=3)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls"
        assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
        check_calls(c.message.tool_calls)


def test_streamed_tool_call_deltas_reassemble_into_the_whole_answer(server):
    no_close = {str(t): -100 for t in token_ids(server, "]") + token_ids(server, "}]")}
    kw = dict(tool_choice="required", logit_bias=no_close, max_tokens=60)
    whole = chat(server, **kw).choices[0]
    stream = chat(server, stream=True, **kw)
    calls = {}
    finish = None
    content = []
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            if d.content:
                content.append(d.content)
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    assert slot["id"] is None, "a call is opened once"
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    assert not "".join(content)
    assert finish == whole.finish_reason
    got = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
    want = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert got == want and len(got) >= 2
    assert all(calls[i]["id"] for i in calls)


def test_an_agent_loop_with_tool_messages_reuses_its_prefix(server):
    results = {"get_weather": "18 C, sunny", "get_time": "14:05"}
    messages = list(QUESTION)
    c = server.client(max_retries=0)
    cached = []
    for turn in range(3):
        r = c.chat.completions.create(model="default", messages=messages, tools=TOOLS,
                                      tool_choice="required" if turn < 2 else "auto",
                                      parallel_tool_calls=False, max_tokens=60, temperature=0)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        m = r.choices[0].message
        if turn == 2:
            # The last turn may answer in text; either way it is well formed.
            assert m.content or m.tool_calls
            check_calls(m.tool_calls or [])
            break
        assert len(m.tool_calls) == 1
        check_calls(m.tool_calls)
        messages.append({"role": "assistant", "content": m.content, "tool_calls": [
            {"id": t.id, "type": "function",
             "function": {"name": t.function.name, "arguments": t.function.arguments}}
            for t in m.tool_calls]})
        for t in m.tool_calls:
            messages.append({"role": "tool", "tool_call_id": t.id,
                             "content": results[t.function.name]})
    # Each turn extends the previous one's prompt: its prefix comes from the radix cache.
    assert cached[1] > 0 and cached[2] > cached[1], cached


def test_a_response_message_goes_back_as_the_client_dumps_it(server):
    # `message.model_dump()` writes every field of OpenAI's message type (`refusal`,
    # `audio`, `function_call`, `annotations` mostly null): a loop that keeps its history
    # that way must work unchanged, and the replayed turn must be the same prompt as the
    # hand-written one (same cached prefix).
    c = server.client(max_retries=0)
    r = chat(server, tool_choice="required", parallel_tool_calls=False, max_tokens=60)
    m = r.choices[0].message
    dumped = m.model_dump()
    assert "refusal" in dumped and "audio" in dumped and "function_call" in dumped
    tool = {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "18 C, sunny"}
    a = c.chat.completions.create(model="default", messages=QUESTION + [dumped, tool],
                                  tools=TOOLS, max_tokens=8, temperature=0)
    b = c.chat.completions.create(model="default", messages=QUESTION + [{
        "role": "assistant", "content": None, "tool_calls": [
            {"id": t.id, "type": "function",
             "function": {"name": t.function.name, "arguments": t.function.arguments}}
            for t in m.tool_calls]}, tool], tools=TOOLS, max_tokens=8, temperature=0)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    assert a.choices[0].message.content == b.choices[0].message.content
    # A refusal is what the assistant said; fields with content sglrs cannot honour are
    # refused by name.
    refused = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "refusal": "I can't help with that."},
               {"role": "user", "content": "why?"}]
    r = c.chat.completions.create(model="default", messages=refused, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    for bad, field in [({"audio": {"id": "a1"}}, "messages[1].audio"),
                       ({"function_call": {"name": "f", "arguments": "{}"}},
                        "messages[1].function_call"),
                       ({"reasoning_content": "hmm"}, "messages[1].reasoning_content"),
                       ({"content": "x", "refusal": "no"}, "messages[1].refusal")]:
        msg = {"role": "assistant", "content": "ok", **bad}
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="default", max_tokens=4, messages=[
                {"role": "user", "content": "hi"}, msg, {"role": "user", "content": "and?"}])
        assert field in str(e.value), e.value


def test_arguments_are_an_object_when_the_schema_leaves_the_type_open(server):
    # `parameters: {}` and `properties` without `type` would, read as JSON Schema, let the
    # arguments be a number or a string; clients pass them on as keyword arguments.
    loose = [{"type": "function", "function": {"name": "ping", "parameters": {}}},
             {"type": "function", "function": {"name": "locate", "parameters": {
                 "properties": {"city": {"type": "string", "maxLength": 20}}}}}]
    for seed in range(4):
        r = chat(server, tools=loose, tool_choice="required", temperature=1.0, seed=seed,
                 max_tokens=60)
        calls = r.choices[0].message.tool_calls
        assert calls, r
        for c in calls:
            assert isinstance(json.loads(c.function.arguments), dict), c


@pytest.mark.parametrize("kw,field", [
    (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name"),
    (dict(tools=[WEATHER, WEATHER]), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
     "tools[0].function.parameters"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
     "tools[0].function.parameters"),
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_time", "arguments": "{"}}]}]),
     "messages[0].tool_calls"),
])
def test_bad_tool_requests_are_refused_by_name(server, kw, field):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server, **kw)
    assert field in str(e.value), e.value
