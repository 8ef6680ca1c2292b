"""BFCL on live servers, one engine at a time: what `sglrs bench agents` runs.

Single-turn categories (simple_python, multiple, parallel, parallel_multiple) are asked once
each and scored with BFCL's own AST checker; `irrelevance` is asked with `tool_choice: "auto"`
and scored right when the answer calls nothing; the multi-turn base category runs as agent loops
against BFCL's executable environments (file system, trading, travel, …), several sessions
in flight, scored with BFCL's multi-turn checker. The same sessions are also replayed along
BFCL's ground truth (`replay`): each step asks the engine for the next call, then appends the
ground truth's call and its executed result, so every engine answers the same prompts and
its turns/s measure the same work (in the live loop an engine whose calls do not parse ends
each turn in one short answer). Every engine gets the same questions, the same tools (BFCL's
schemas mapped to JSON Schema as BFCL's OpenAI handler maps them), the same prompt text (a
peer serving the model's own template, which renders no tools, gets the tool list written
into its messages as sglrs writes it), the same sampling (T=0) and the same threads.
`--parts` picks what runs. The last line printed is one JSON object.

Only BFCL's non-live categories are used here; `live_*` is kept for independent checks.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any

SINGLE = ["simple_python", "multiple", "parallel", "parallel_multiple"]
# Questions none of the offered functions can answer: asked with `tool_choice: "auto"`,
# right when the answer calls nothing (BFCL's relevance check).
IRRELEVANCE = "irrelevance"
MULTI = "multi_turn_base"
MAX_STEPS = 5  # model calls per user turn in the agent loop


def load_bfcl(root: str) -> dict[str, Any]:
    """BFCL's checkers, importable without the API clients its model registry pulls in."""
    sys.path.insert(0, root)
    # `ast_checker` reads `MODEL_CONFIG_MAPPING[model].underscore_to_dot` only to undo the
    # `.` → `_` renaming of OpenAI-style handlers; names are mapped back here before scoring,
    # so every engine reads as "no renaming". The real module imports every vendor SDK.
    cfg = types.ModuleType("bfcl_eval.constants.model_config")
    cfg.MODEL_CONFIG_MAPPING = defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=False))
    sys.modules[cfg.__name__] = cfg
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call
    return dict(Language=Language, ast_checker=ast_checker, multi_turn_checker=multi_turn_checker,
                execute=execute_multi_turn_func_call, func_doc_files=MULTI_TURN_FUNC_DOC_FILE_MAPPING,
                data=os.path.join(root, "bfcl_eval", "data"))


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string", "list": "array",
         "bool": "boolean", "double": "number", "long": "integer", "short": "integer",
         "byte": "integer", "char": "string"}


def to_json_schema(p: Any) -> Any:
    """BFCL's parameter schema as JSON Schema (BFCL's own type mapping)."""
    if isinstance(p, list):
        return [to_json_schema(x) for x in p]
    if not isinstance(p, dict):
        return p
    out = {}
    for k, v in p.items():
        if k == "type" and isinstance(v, str):
            out[k] = TYPES.get(v, v)
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: to_json_schema(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf"):
            out[k] = to_json_schema(v)
        elif k == "optional":
            continue
        else:
            out[k] = v
    if out.get("type") == "object" and "properties" in out:
        out["required"] = [r for r in out.get("required", []) if r in out["properties"]]
    return out


def tools_of(functions: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """OpenAI tools for BFCL functions, and the map back from the OpenAI-legal names."""
    tools, names = [], {}
    for f in functions:
        legal = re.sub(r"[^A-Za-z0-9_-]", "_", f["name"])[:64]
        names[legal] = f["name"]
        tools.append({"type": "function", "function": {
            "name": legal, "description": f.get("description", ""),
            "parameters": to_json_schema(f.get("parameters", {"type": "object", "properties": {}}))}})
    return tools, names


def compact(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def render_tools_as_text(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The messages as sglrs renders them for a chat template that knows no tools
    (`prompt_messages` in runtime/server/src/openai/tools.rs): the tool list appended to the
    system message, past calls written as the assistant's text in the `<tool_call>[…]` list."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m.pop("tool_calls"):
                f = c["function"]
                args = f.get("arguments")
                args = json.loads(args) if isinstance(args, str) else (args or {})
                calls.append(f'{{"name": {json.dumps(f["name"], ensure_ascii=False)}, '
                             f'"arguments": {compact(args)}}}')
            text = "<tool_call>[" + ", ".join(calls) + "]</tool_call>"
            before = (m.get("content") or "").rstrip()
            m["content"] = f"{before}\n{text}" if before else text
        out.append(m)
    text = ("You can call functions. Each one is described below with a JSON Schema of its "
            "arguments:\n<tools>\n")
    for t in tools:
        f = t["function"]
        d = {"name": f["name"], "parameters": f.get("parameters")}
        if f.get("description") is not None:
            d["description"] = f["description"]
        text += compact(d) + "\n"
    text += ("</tools>\nTo call functions, answer with only <tool_call>[{\"name\": \"function "
             "name\", \"arguments\": {…}}, …]</tool_call>, one list item per call. If no function "
             "fits, answer in plain text.")
    if out and out[0].get("role") == "system":
        before = out[0].get("content") or ""
        out[0] = {**out[0], "content": f"{before}\n\n{text}" if before else text}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class Engine:
    """One server, started for this engine's runs and stopped after."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], model: str, port: int,
                 tool_choice_required: str = "required", render_tools: bool = False) -> None:
        self.name, self.cmd, self.env, self.model, self.port = name, cmd, env, model, port
        self.base = f"http://127.0.0.1:{port}"
        self.required = tool_choice_required
        # The model's template renders no tools: sglrs then writes them into the system
        # message itself. A peer serving the same template gets that same text from here,
        # so both read the same prompt (`tools` is still sent for the peer's own parsing
        # and guided decoding).
        self.render_tools = render_tools
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> None:
        log = open(f"/tmp/sglrs-bench-agents-{self.name}.log", "w")
        self.proc = subprocess.Popen(self.cmd, env={**os.environ, **self.env}, stdout=log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {log.name}")
            try:
                urllib.request.urlopen(self.base + "/v1/models", timeout=2).read()
                return
            except Exception:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not come up in {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def chat(self, messages: list[dict], tools: list[dict], tool_choice: Any,
             max_tokens: int) -> dict:
        if self.render_tools:
            messages = render_tools_as_text(messages, tools)
        body = {"model": self.model, "messages": messages, "tools": tools,
                "tool_choice": tool_choice, "temperature": 0, "max_tokens": max_tokens}
        req = urllib.request.Request(self.base + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)


class Tally:
    """Counts shared by the threads of one engine's run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.valid = 0
        self.prompt = 0
        self.cached = 0
        self.cached_known = True
        self.errors: list[str] = []

    def usage(self, r: dict) -> None:
        u = r.get("usage") or {}
        d = u.get("prompt_tokens_details") or {}
        with self.lock:
            self.prompt += u.get("prompt_tokens", 0)
            if d.get("cached_tokens") is None:
                self.cached_known = False
            else:
                self.cached += d["cached_tokens"]


def decode_calls(msg: dict, names: dict[str, str], schemas: dict[str, dict], tally: Tally,
                 must_call: bool) -> list[tuple[str, dict]] | None:
    """The calls of an answer as (BFCL name, arguments); counts valid and invalid calls.

    A call is valid when its arguments parse as a JSON object that validates against its
    function's schema; an answer that had to call and called nothing counts as one invalid
    call."""
    import jsonschema
    out = []
    calls = msg.get("tool_calls") or []
    with tally.lock:
        if not calls and must_call:
            tally.calls += 1
        for c in calls:
            tally.calls += 1
            f = c.get("function") or {}
            name = f.get("name")
            try:
                args = json.loads(f.get("arguments") or "")
            except (TypeError, ValueError):
                continue
            if name not in names or not isinstance(args, dict):
                continue
            try:
                jsonschema.validate(args, schemas[name])
            except jsonschema.ValidationError:
                out.append((names[name], args))
                continue
            except jsonschema.SchemaError:
                pass
            tally.valid += 1
            out.append((names[name], args))
    return out


def single_turn(engine: Engine, bfcl: dict, category: str, limit: int, workers: int,
                tally: Tally, max_tokens: int) -> float:
    data = read_jsonl(os.path.join(bfcl["data"], f"BFCL_v4_{category}.json"))[:limit]
    answers = {a["id"]: a for a in read_jsonl(
        os.path.join(bfcl["data"], "possible_answer", f"BFCL_v4_{category}.json"))}

    def one(entry: dict) -> bool:
        tools, names = tools_of(entry["function"])
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        messages = entry["question"][0]
        try:
            r = engine.chat(messages, tools, engine.required, max_tokens)
        except urllib.error.HTTPError as e:
            with tally.lock:
                tally.errors.append(f"{entry['id']}: HTTP {e.code} {e.read()[:200]!r}")
                tally.calls += 1
            return False
        tally.usage(r)
        calls = decode_calls(r["choices"][0]["message"], names, schemas, tally, True)
        output = [{name: args} for name, args in calls]
        res = bfcl["ast_checker"](entry["function"], output, answers[entry["id"]]["ground_truth"],
                                  bfcl["Language"].PYTHON, category, engine.name)
        return bool(res["valid"])

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        ok = list(pool.map(one, data))
    return sum(ok) / len(ok) if ok else 0.0


def irrelevance(engine: Engine, bfcl: dict, limit: int, tally: Tally, max_tokens: int) -> float:
    """Share of `irrelevance` questions answered without a call (in `auto`, the model may
    answer in text; an enforced engine must not force a call there)."""
    data = read_jsonl(os.path.join(bfcl["data"], f"BFCL_v4_{IRRELEVANCE}.json"))[:limit]
    ok = []
    for entry in data:
        tools, names = tools_of(entry["function"])
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        try:
            r = engine.chat(entry["question"][0], tools, "auto", max_tokens)
        except urllib.error.HTTPError as e:
            with tally.lock:
                tally.errors.append(f"{entry['id']}: HTTP {e.code} {e.read()[:200]!r}")
            ok.append(False)
            continue
        tally.usage(r)
        calls = decode_calls(r["choices"][0]["message"], names, schemas, tally, False)
        ok.append(not calls)
    return sum(ok) / len(ok) if ok else 0.0


def call_string(name: str, args: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def multi_turn(engine: Engine, bfcl: dict, sessions: int, concurrency: int, tally: Tally,
               max_tokens: int) -> dict:
    data = read_jsonl(os.path.join(bfcl["data"], f"BFCL_v4_{MULTI}.json"))[:sessions]
    answers = {a["id"]: a for a in read_jsonl(
        os.path.join(bfcl["data"], "possible_answer", f"BFCL_v4_{MULTI}.json"))}
    docs_dir = os.path.join(bfcl["data"], "multi_turn_func_doc")
    turn_ms: list[float] = []
    step_count = [0]
    lock = threading.Lock()
    tag = re.sub(r"[^A-Za-z0-9]", "_", engine.name)

    def one(entry: dict) -> bool:
        functions = []
        for cls in entry["involved_classes"]:
            functions += read_jsonl(os.path.join(docs_dir, bfcl["func_doc_files"][cls]))
        excluded = set(entry.get("excluded_function", []))
        functions = [f for f in functions if f["name"] not in excluded]
        tools, names = tools_of(functions)
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        messages: list[dict] = []
        decoded_turns: list[list[list[str]]] = []
        for turn in entry["question"]:
            messages += copy.deepcopy(turn)
            t0 = time.time()
            steps: list[list[str]] = []
            for step in range(MAX_STEPS):
                # The first answer of a turn must call; later ones may end the turn in text.
                choice = engine.required if step == 0 else "auto"
                try:
                    r = engine.chat(messages, tools, choice, max_tokens)
                except urllib.error.HTTPError as e:
                    with tally.lock:
                        tally.errors.append(f"{entry['id']}: HTTP {e.code} {e.read()[:200]!r}")
                    break
                tally.usage(r)
                with lock:
                    step_count[0] += 1
                msg = r["choices"][0]["message"]
                calls = decode_calls(msg, names, schemas, tally, step == 0)
                if not calls:
                    messages.append({"role": "assistant", "content": msg.get("content") or ""})
                    break
                strings = [call_string(n, a) for n, a in calls]
                steps.append(strings)
                results, _ = bfcl["execute"](strings, entry["initial_config"],
                                             entry["involved_classes"], tag, entry["id"])
                ids = [c.get("id") or f"call_{i}" for i, c in enumerate(msg["tool_calls"])]
                messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": [
                    {"id": ids[i], "type": "function", "function": c["function"]}
                    for i, c in enumerate(msg["tool_calls"][:len(strings)])]})
                for i, res in enumerate(results):
                    messages.append({"role": "tool", "tool_call_id": ids[min(i, len(ids) - 1)],
                                     "content": str(res)})
            with lock:
                turn_ms.append((time.time() - t0) * 1000)
            decoded_turns.append(steps)
        try:
            res = bfcl["multi_turn_checker"](decoded_turns, answers[entry["id"]]["ground_truth"],
                                             entry, MULTI, tag)
            return bool(res["valid"])
        except Exception as e:  # the checker executes model calls: count a crash as a miss
            with tally.lock:
                tally.errors.append(f"{entry['id']}: checker {type(e).__name__}: {e}"[:300])
            return False

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        ok = list(pool.map(one, data))
    wall = time.time() - t0
    return {"accuracy": sum(ok) / len(ok) if ok else 0.0, "turns": len(turn_ms),
            "turns_per_s": len(turn_ms) / wall if wall else None, "wall_s": wall,
            "steps": step_count[0], "steps_per_s": step_count[0] / wall if wall else None,
            "turn_latency_ms": {"p50": percentile(turn_ms, 50), "p99": percentile(turn_ms, 99)}}


def ground_truth_call(text: str, functions: dict[str, dict], legal: dict[str, str]) -> tuple[str, dict]:
    """One of BFCL's ground-truth call strings (`cd(folder='document')`, `sort('a.pdf')`) as
    (OpenAI-legal name, arguments); positional arguments take the parameters' order."""
    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name), text
    name = call.func.id
    params = list((functions[name].get("parameters") or {}).get("properties") or {})
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(call.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
    return legal[name], args


def multi_turn_replay(engine: Engine, bfcl: dict, sessions: int, concurrency: int,
                      max_tokens: int) -> dict:
    """The multi-turn sessions replayed along BFCL's ground truth, the same prompts for every
    engine: each step asks the engine for the next call (`tool_choice` as a turn's first
    answer gets it), then the ground truth's call and its executed result are appended
    whatever the engine answered. A turn is one request per ground-truth call (one in
    `auto` where the ground truth calls nothing), so every engine does the same work over
    the same growing conversation, unlike the live loop, where an engine whose calls do not
    parse ends each turn in one short answer."""
    data = read_jsonl(os.path.join(bfcl["data"], f"BFCL_v4_{MULTI}.json"))[:sessions]
    answers = {a["id"]: a for a in read_jsonl(
        os.path.join(bfcl["data"], "possible_answer", f"BFCL_v4_{MULTI}.json"))}
    docs_dir = os.path.join(bfcl["data"], "multi_turn_func_doc")
    tally = Tally()
    turn_ms: list[float] = []
    steps = [0, 0]  # requests, first call named as the ground truth's
    completion = [0]
    lock = threading.Lock()
    tag = re.sub(r"[^A-Za-z0-9]", "_", engine.name) + "_replay"

    def one(entry: dict) -> None:
        functions = []
        for cls in entry["involved_classes"]:
            functions += read_jsonl(os.path.join(docs_dir, bfcl["func_doc_files"][cls]))
        excluded = set(entry.get("excluded_function", []))
        functions = [f for f in functions if f["name"] not in excluded]
        tools, names = tools_of(functions)
        legal = {v: k for k, v in names.items()}
        by_name = {f["name"]: f for f in functions}
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        messages: list[dict] = []
        for t, (turn, truth) in enumerate(zip(entry["question"], answers[entry["id"]]["ground_truth"])):
            messages += copy.deepcopy(turn)
            t0 = time.time()
            for k, text in enumerate(truth or [None]):
                choice = (engine.required if k == 0 else "auto") if text else "auto"
                try:
                    r = engine.chat(messages, tools, choice, max_tokens)
                except urllib.error.HTTPError as e:
                    with tally.lock:
                        tally.errors.append(f"{entry['id']}: HTTP {e.code} {e.read()[:200]!r}")
                    r = None
                if r is not None:
                    tally.usage(r)
                    msg = r["choices"][0]["message"]
                    calls = decode_calls(msg, names, schemas, tally, choice != "auto")
                    with lock:
                        steps[0] += 1
                        completion[0] += (r.get("usage") or {}).get("completion_tokens", 0)
                        if text and calls and calls[0][0] == text.split("(")[0]:
                            steps[1] += 1
                if text is None:
                    messages.append({"role": "assistant", "content": "Done."})
                    continue
                name, args = ground_truth_call(text, by_name, legal)
                results, _ = bfcl["execute"]([text], entry["initial_config"],
                                             entry["involved_classes"], tag, entry["id"])
                cid = f"call_{t}_{k}"
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": cid, "type": "function",
                     "function": {"name": name, "arguments": json.dumps(args)}}]})
                messages.append({"role": "tool", "tool_call_id": cid, "content": str(results[0])})
            with lock:
                turn_ms.append((time.time() - t0) * 1000)

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, data))
    wall = time.time() - t0
    return {"turns": len(turn_ms), "steps": steps[0], "wall_s": wall,
            "turns_per_s": len(turn_ms) / wall if wall else None,
            "steps_per_s": steps[0] / wall if wall else None,
            "turn_latency_ms": {"p50": percentile(turn_ms, 50), "p99": percentile(turn_ms, 99)},
            "next_call_named_right": steps[1] / steps[0] if steps[0] else None,
            "valid_call_rate": tally.valid / tally.calls if tally.calls else None,
            "prompt_tokens_per_step": tally.prompt / steps[0] if steps[0] else None,
            "completion_tokens_per_step": completion[0] / steps[0] if steps[0] else None,
            "cache_hit_rate": tally.cached / tally.prompt if tally.cached_known and tally.prompt else None,
            "errors": len(tally.errors), "error_examples": tally.errors[:3]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engines(args: argparse.Namespace) -> list[Engine]:
    out = []
    t = str(args.threads)
    for name in args.engines.split(","):
        port = free_port()
        if name in ("sglrs", "sglrs-free"):
            cmd = [args.sglrs_bin, "serve", "--model", args.model, "--host", "127.0.0.1",
                   "--port", str(port), "--threads", t, "--served-model-name", "smollm2"]
            if name == "sglrs-free":
                cmd.append("--disable-tool-grammar")
            out.append(Engine(name, cmd, {}, "smollm2", port))
        elif name == "llamacpp":
            cmd = [args.llamacpp_python, "-m", "llama_cpp.server", "--model", args.model,
                   "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
                   "--n_threads", t, "--n_threads_batch", t, "--logits_all", "False",
                   "--interrupt_requests", "False", "--model_alias", "smollm2",
                   "--chat_format", "chatml-function-calling"]
            out.append(Engine(name, cmd, {}, "smollm2", port, tool_choice_required="auto"))
        elif name == "vllm":
            cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                   args.hf_dir, "--host", "127.0.0.1", "--port", str(port),
                   "--served-model-name", "smollm2", "--enable-prefix-caching",
                   "--enable-prompt-tokens-details", "--max-model-len", "8192",
                   # Its own tool calling: `required` and named choices by guided JSON,
                   # `auto` parsed with the Hermes parser (the `<tool_call>` tags).
                   "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
            env = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_HOST_IP": "127.0.0.1",
                   "OMP_NUM_THREADS": t, "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}
            out.append(Engine(name, cmd, env, "smollm2", port, render_tools=True))
        else:
            raise SystemExit(f"unknown engine {name!r} (sglrs, sglrs-free, llamacpp, vllm)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bfcl-root", required=True, help="folder holding bfcl_eval/")
    ap.add_argument("--engines", default="sglrs,sglrs-free")
    ap.add_argument("--model", required=True)
    ap.add_argument("--sglrs-bin", required=True)
    ap.add_argument("--llamacpp-python", default="/tmp/llamapeer/bin/python")
    ap.add_argument("--vllm-python", default="/tmp/vllmpeer/bin/python")
    ap.add_argument("--hf-dir", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=40, help="questions per single-turn category")
    ap.add_argument("--sessions", type=int, default=8, help="multi-turn sessions")
    ap.add_argument("--concurrency", type=int, default=4, help="sessions in flight")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--parts", default="single,loop,replay",
                    help="what to run: single (single-turn categories and irrelevance), loop "
                         "(multi-turn live agent loops), replay (multi-turn along the ground truth)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts or parts - {"single", "loop", "replay"}:
        raise SystemExit(f"--parts: {args.parts!r} (single, loop, replay)")
    bfcl = load_bfcl(args.bfcl_root)
    result: dict[str, Any] = {}
    for e in engines(args):
        print(f"bench agents: {e.name}: starting", file=sys.stderr, flush=True)
        try:
            e.start(args.start_timeout)
        except RuntimeError as err:
            result[e.name] = {"error": str(err)}
            print(f"bench agents: {e.name}: {err}", file=sys.stderr, flush=True)
            continue
        try:
            tally = Tally()
            t0 = time.time()
            acc: dict[str, float] = {}
            if "single" in parts:
                for c in SINGLE:
                    acc[c] = single_turn(e, bfcl, c, args.limit, 1, tally, args.max_tokens)
                acc[IRRELEVANCE] = irrelevance(e, bfcl, args.limit, tally, args.max_tokens)
            single_s = time.time() - t0
            mt: dict[str, Any] = {"turns_per_s": None, "turn_latency_ms": {"p50": None, "p99": None},
                                  "turns": 0, "steps": 0, "steps_per_s": None, "wall_s": None}
            if "loop" in parts:
                mt = multi_turn(e, bfcl, args.sessions, args.concurrency, tally, args.max_tokens)
                acc[MULTI] = mt["accuracy"]
            replay = None
            if "replay" in parts:
                replay = multi_turn_replay(e, bfcl, args.sessions, args.concurrency, args.max_tokens)
            result[e.name] = {
                "accuracy": acc,
                "valid_call_rate": tally.valid / tally.calls if tally.calls else None,
                "calls": tally.calls,
                "turns_per_s": mt["turns_per_s"],
                "turn_latency_ms": mt["turn_latency_ms"],
                "multi_turn_turns": mt["turns"],
                # Model answers in the agent loops: a turn takes more of them when the
                # engine's calls parse (each is executed and answered), one when they do not.
                "multi_turn_steps": mt["steps"],
                "steps_per_s": mt["steps_per_s"],
                "multi_turn_wall_s": mt["wall_s"],
                "single_turn_wall_s": single_s,
                "cache_hit_rate": tally.cached / tally.prompt if tally.cached_known and tally.prompt else None,
                "tool_choice_first_step": e.required,
                "tools_rendered_by_client": e.render_tools,
                "replay": replay,
                "errors": len(tally.errors),
                "error_examples": tally.errors[:3],
            }
            print(f"bench agents: {e.name}: {json.dumps(result[e.name])}", file=sys.stderr, flush=True)
        finally:
            e.stop()
    print(json.dumps({"engines": result,
                      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "config": {
        "categories": SINGLE + [IRRELEVANCE, MULTI], "limit_per_single_turn_category": args.limit,
        "multi_turn_sessions": args.sessions, "sessions_in_flight": args.concurrency,
        "max_steps_per_turn": MAX_STEPS, "max_tokens": args.max_tokens, "temperature": 0,
        "parts": sorted(parts),
        "threads": args.threads}}))


if __name__ == "__main__":
    main()
