"""End-to-end test of sglrs with the official `openai` Python client.

Run:  pip install openai jsonschema
      cargo build --release -p sglrs-runtime --bin sglrs
      python3 tests/python/test_openai.py            # starts target/release/sglrs itself
  or  SGLRS_BASE_URL=http://127.0.0.1:30000 python3 tests/python/test_openai.py

Checks chat, streaming, response_format json_schema (every output parses and validates with
jsonschema, at temperature 0 and 0.7), and tools with a named tool_choice. Works under
pytest as well (each check is a test_* function).
"""

import atexit
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import jsonschema
import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_server = None
_client = None

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
        },
        "emails": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "address", "emails"],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


def client():
    global _server, _client
    if _client is not None:
        return _client
    base = os.environ.get("SGLRS_BASE_URL")
    if not base:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        binary = os.environ.get("SGLRS_BIN") or os.path.join(
            os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "sglrs"
        )
        _server = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", str(port)])
        atexit.register(_stop_server)  # under pytest too, where main()'s finally never runs
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except Exception:
                if _server.poll() is not None or time.time() > deadline:
                    raise RuntimeError("sglrs serve did not come up")
                time.sleep(0.3)
    _client = openai.OpenAI(base_url=base + "/v1", api_key=os.environ.get("SGLRS_API_KEY", "none"))
    return _client


def _stop_server():
    global _server
    if _server is not None and _server.poll() is None:
        _server.terminate()
        try:
            _server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _server.kill()
            _server.wait()
    _server = None


def model():
    return client().models.list().data[0].id


def test_chat():
    r = client().chat.completions.create(
        model=model(),
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
        max_tokens=16,
        temperature=0,
    )
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streaming():
    stream = client().chat.completions.create(
        model=model(),
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    text = "".join(pieces)
    assert text, "no streamed text"
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0
    # The stream carries the same text as the non-streaming answer.
    r = client().chat.completions.create(
        model=model(), messages=[{"role": "user", "content": "Count from one to five."}], max_tokens=24, temperature=0
    )
    assert r.choices[0].message.content == text, (r.choices[0].message.content, text)


def test_json_schema():
    for temperature in (0.0, 0.7):
        for i in range(3):
            r = client().chat.completions.create(
                model=model(),
                messages=[{"role": "user", "content": f"Invent person number {i} as JSON."}],
                max_tokens=200,
                temperature=temperature,
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
            )
            out = json.loads(r.choices[0].message.content)
            jsonschema.validate(out, PERSON)


# 2020-12 keywords whose meaning depends on other subschemas: `unevaluatedProperties` (keys
# declared by the `allOf` part and the `oneOf` branch taken are evaluated) and counted
# `contains`. Validated with jsonschema's 2020-12 validator, at tight budgets too.
RECORD = {
    "type": "object",
    "allOf": [{"properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["id"]}],
    "oneOf": [
        {"properties": {"kind": {"const": "a"}, "x": {"type": "string", "maxLength": 8}}, "required": ["kind", "x"]},
        {"properties": {"kind": {"const": "b"}, "tags": {
            "type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 5},
            "contains": {"type": "string", "const": "t"}, "minContains": 1, "maxContains": 2}},
         "required": ["kind", "tags"]},
    ],
    "unevaluatedProperties": False,
}


def test_json_schema_2020_keywords():
    for seed in range(3):
        for max_tokens in (200, 25):
            r = client().chat.completions.create(
                model=model(),
                messages=[{"role": "user", "content": "Give me a record."}],
                max_tokens=max_tokens,
                temperature=1.0,
                seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}},
            )
            out = json.loads(r.choices[0].message.content)
            jsonschema.Draft202012Validator(RECORD).validate(out)


# pydantic's `set[int]` / zod's `z.set(z.number().int())` and `z.set(z.number())`, as MCP
# tools declare them: every
# call's arguments hold distinct integers, also when the prompt asks for repeats and under a
# tight budget (jsonschema checks `uniqueItems`).
TAG_TOOL = {
    "type": "function",
    "function": {
        "name": "tag_items",
        "description": "Tag the items with the given ids",
        "parameters": {
            "properties": {
                "ids": {"items": {"type": "integer"}, "title": "Ids", "type": "array", "uniqueItems": True},
                "ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3},
                          "uniqueItems": True, "minItems": 1},
                # zod's z.set(z.number()): numbers in one spelling each.
                "weights": {"type": "array", "items": {"type": "number"}, "uniqueItems": True},
            },
            "required": ["ids", "ports", "weights"],
            "title": "tag_itemsArguments",
            "type": "object",
        },
    },
}


def test_unique_integer_items():
    params = TAG_TOOL["function"]["parameters"]
    for seed in range(3):
        # 45: a few tokens over the shortest call (39 tokens; below it the request is a 400).
        for max_tokens in (120, 45):
            r = client().chat.completions.create(
                model=model(),
                messages=[{"role": "user", "content": "Tag items 7, 7, 7, 12, 12 and 1 on ports 1, 1, 2, 3, 3 with weights 0.5, 0.5, 1.0."}],
                tools=[TAG_TOOL],
                tool_choice={"type": "function", "function": {"name": "tag_items"}},
                max_tokens=max_tokens,
                temperature=1.0,
                seed=seed,
            )
            calls = r.choices[0].message.tool_calls
            assert calls and calls[0].function.name == "tag_items", r
            jsonschema.validate(json.loads(calls[0].function.arguments), params)
    r = client().chat.completions.create(
        model=model(),
        messages=[{"role": "user", "content": "Count to five twice, as a JSON object with the numbers in ids."}],
        max_tokens=80,
        temperature=0.0,
        response_format={"type": "json_schema", "json_schema": {"name": "tags", "schema": params}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), params)


# pydantic's HttpUrl in a FastMCP tool (`format: uri`, `maxLength: 2083`), and a URL list
# whose items allow 100 characters: both beyond a regex x count product, so the matcher
# counts their characters.
FETCH_TOOL = {
    "type": "function",
    "function": {
        "name": "fetch",
        "description": "Fetch a web page",
        "parameters": {
            "properties": {
                "url": {"format": "uri", "maxLength": 2083, "minLength": 1, "title": "Url", "type": "string"},
                "mirrors": {"items": {"format": "uri", "maxLength": 100, "type": "string"}, "maxItems": 2,
                            "title": "Mirrors", "type": "array"},
            },
            "required": ["url", "mirrors"],
            "title": "fetchArguments",
            "type": "object",
        },
    },
}


def _uri_ok(u: str, most: int) -> bool:
    scheme, sep, _ = u.partition(":")
    return bool(sep) and scheme[:1].isalpha() and " " not in u and 1 <= len(u) <= most


def test_pydantic_url_tool():
    params = FETCH_TOOL["function"]["parameters"]
    for seed in range(3):
        r = client().chat.completions.create(
            model=model(),
            messages=[{"role": "user", "content": "Fetch the sglrs docs page and list two mirrors."}],
            tools=[FETCH_TOOL],
            tool_choice="required",
            max_tokens=160,
            temperature=1.0,
            seed=seed,
        )
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "fetch", r
        args = json.loads(calls[0].function.arguments)
        jsonschema.validate(args, params)
        assert _uri_ok(args["url"], 2083), args
        assert all(_uri_ok(m, 100) for m in args["mirrors"]), args


def test_named_tool_choice():
    r = client().chat.completions.create(
        model=model(),
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=0.7,
    )
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", r
    args = json.loads(calls[0].function.arguments)
    jsonschema.validate(args, WEATHER_TOOL["function"]["parameters"])
    assert r.choices[0].finish_reason == "tool_calls"


def test_bad_request_names_the_field():
    try:
        client().chat.completions.create(
            model=model(), messages=[{"role": "user", "content": "hi"}], max_tokens=-3
        )
    except openai.BadRequestError as e:
        assert "max_tokens" in str(e)
    else:
        raise AssertionError("expected HTTP 400")


def main():
    failed = 0
    try:
        for name, fn in list(globals().items()):
            if name.startswith("test_") and callable(fn):
                t = time.time()
                try:
                    fn()
                    print(f"ok   {name} ({time.time() - t:.1f}s)")
                except Exception as e:  # report every failure, then exit non-zero
                    failed += 1
                    print(f"FAIL {name}: {e!r}")
    finally:
        _stop_server()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
