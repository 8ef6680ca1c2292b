"""The language layer without a server: prompt assembly, roles, fork/join, select scoring.

These drive the interpreter with a small scripted backend that records the native `/generate`
requests it is given and answers them deterministically; the acceptance tests against a real
server are in `test_server.py`.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Dict, Iterator, List

import pytest

import sglrs as sgl
from sglrs.backend.base import GenerateApiBackend
from sglrs.lang.chat_template import ChatTemplate, get_chat_template, jinja_renderer
from sglrs.lang.choices import heal_first_token, normalized_logprob


class ScriptedBackend(GenerateApiBackend):
    """Answers each generation with ``<n>`` tokens named after the request count.

    `select` requests are answered with per-choice logprobs from `choice_scores`.
    """

    def __init__(self, template: str = "chatml") -> None:
        self.chat_template = get_chat_template(template)
        self.requests: List[Dict[str, Any]] = []
        self.lock = threading.Lock()
        self.choice_scores: Dict[str, List[float]] = {}

    def _request(self, payload: Dict[str, Any]) -> Any:
        with self.lock:
            self.requests.append(json.loads(json.dumps(payload)))
            n = len(self.requests)
        text = payload.get("text")
        params = payload.get("sampling_params", {})
        if isinstance(text, list):
            out = []
            for t in text:
                choice = next(c for c in self.choice_scores if t.endswith(c))
                # two prompt tokens (the healing window), then the choice's tokens
                entries: List[List[Any]] = [[-0.5, 1, "x"], [-0.25, 2, "y"]]
                entries += [[lp, 3, "c"] for lp in self.choice_scores[choice]]
                out.append({"text": "", "meta_info": {"input_token_logprobs": entries,
                                                      "output_token_logprobs": []}})
            return out
        if params.get("max_new_tokens") == 0:
            return {"text": "", "meta_info": {"prompt_tokens": len(str(text)) // 4}}
        return {"text": f"<{n}>", "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}}

    def _request_stream(self, payload: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        with self.lock:
            self.requests.append(payload)
        acc = ""
        for piece in ["Hel", "lo", " wor", "ld"]:
            acc += piece
            yield {"text": acc, "meta_info": {"completion_tokens": len(acc)}}


def test_few_shot_prompt_is_assembled_in_order() -> None:
    be = ScriptedBackend()

    @sgl.function
    def few_shot(s: Any, question: str) -> None:
        s += "Q: 1+1?\nA: 2\n"
        s += "Q: " + question + "\nA:"
        s += sgl.gen("answer", max_tokens=8, stop="\n", temperature=0)

    st = few_shot.run(question="2+2?", backend=be)
    assert st["answer"] == "<1>"
    assert st.text() == "Q: 1+1?\nA: 2\nQ: 2+2?\nA:<1>"
    req = be.requests[0]
    assert req["text"] == "Q: 1+1?\nA: 2\nQ: 2+2?\nA:"
    sp = req["sampling_params"]
    assert sp["max_new_tokens"] == 8 and sp["temperature"] == 0
    # the chat template's stop string is added to the program's own
    assert sp["stop"] == ["\n", "<|im_end|>"]


def test_program_defaults_and_overrides() -> None:
    be = ScriptedBackend("default")

    @sgl.function
    def prog(s: Any) -> None:
        s += sgl.gen("a")
        s += sgl.gen("b", max_tokens=3, top_k=5, min_p=0.1, top_p=0.9)

    prog.run(backend=be, max_new_tokens=77, temperature=0.5).sync()
    a, b = (r["sampling_params"] for r in be.requests)
    assert a["max_new_tokens"] == 77 and a["temperature"] == 0.5 and a["top_k"] == -1
    assert "stop" not in a
    assert b["max_new_tokens"] == 3 and b["top_k"] == 5 and b["min_p"] == 0.1
    assert b["top_p"] == 0.9 and b["temperature"] == 0.5


def test_roles_use_template_and_build_messages() -> None:
    be = ScriptedBackend()

    @sgl.function
    def chat(s: Any) -> None:
        s += sgl.system("Be brief.")
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("r1", max_tokens=4))
        with s.user():
            s += "And "
            s += "again"
        s += sgl.assistant_begin()
        s += sgl.gen("r2", max_tokens=4)
        s += sgl.assistant_end()

    st = chat.run(backend=be)
    assert st.text() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<1><|im_end|>\n"
        "<|im_start|>user\nAnd again<|im_end|>\n"
        "<|im_start|>assistant\n<2><|im_end|>\n"
    )
    assert st.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<1>"},
        {"role": "user", "content": "And again"},
        {"role": "assistant", "content": "<2>"},
    ]


def test_default_system_prompt_is_inserted() -> None:
    be = ScriptedBackend("qwen")

    @sgl.function
    def chat(s: Any) -> None:
        s += sgl.user("Hi")

    st = chat.run(backend=be)
    assert st.messages()[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert st.text().startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_nested_roles_fail_clearly() -> None:
    be = ScriptedBackend()

    @sgl.function
    def bad(s: Any) -> None:
        s += sgl.user_begin()
        s += sgl.assistant_begin()
        s += sgl.gen("x")

    with pytest.warns(RuntimeWarning):
        st = bad.run(backend=be)
        err = st.error()
    assert isinstance(err, ValueError) and "inside an open 'user'" in str(err)
    with pytest.raises(sgl.ProgramError):
        st["x"]


def test_fork_commits_prefix_once_and_join_gathers() -> None:
    be = ScriptedBackend()

    @sgl.function
    def tree(s: Any) -> None:
        s += "Shared prefix. "
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}: "
        forks += sgl.gen("idea", max_tokens=4)
        forks.join()

    st = tree.run(backend=be)
    st.sync()
    # request 1 is the prefix commit (max_new_tokens 0), then one gen per branch
    assert be.requests[0] == {"text": "Shared prefix. ", "sampling_params": {"max_new_tokens": 0}}
    gens = be.requests[1:]
    assert sorted(r["text"] for r in gens) == [f"Shared prefix. Branch {i}: " for i in range(3)]
    ideas = st["idea"]
    assert isinstance(ideas, list) and len(ideas) == 3
    assert sorted(ideas) == ["<2>", "<3>", "<4>"]
    # the parent's text is unchanged by the branches
    assert st.text() == "Shared prefix. "


def test_fork_branches_run_concurrently() -> None:
    started = threading.Barrier(4, timeout=5)

    class Barriered(ScriptedBackend):
        def _request(self, payload: Dict[str, Any]) -> Any:
            if payload["sampling_params"].get("max_new_tokens") != 0:
                started.wait()  # all four branches must be in flight at once
            return super()._request(payload)

    be = Barriered()

    @sgl.function
    def tree(s: Any) -> None:
        s += "P"
        f = s.fork(4)
        f += sgl.gen("x", max_tokens=1)
        f.join()

    st = tree.run(backend=be)
    assert len(st["x"]) == 4


def test_select_request_shapes_and_scoring() -> None:
    be = ScriptedBackend()
    be.choice_scores = {"yes": [-0.1], "no thanks": [-0.05, -3.0]}

    @sgl.function
    def pick(s: Any) -> None:
        s += "Answer:"
        s += sgl.select("ans", choices=["yes", "no thanks"])

    st = pick.run(backend=be)
    assert st["ans"] == "yes"
    assert st.text() == "Answer:yes"
    first, second = be.requests
    assert first == {"text": "Answer:", "sampling_params": {"max_new_tokens": 0}}
    assert second["text"] == ["Answer:yes", "Answer:no thanks"]
    assert second["sampling_params"] == {"max_new_tokens": 0, "temperature": 0}
    assert second["return_logprob"] is True
    assert second["logprob_start_len"] == max(len("Answer:") // 4 - 2, 0)
    meta = st.get_meta_info("ans")
    # "x" is not a suffix of "Answer:": no healing, all four tokens count
    assert meta["normalized_prompt_logprobs"][0] == pytest.approx((-0.5 - 0.25 - 0.1) / 3)


def test_gen_with_choices_is_select() -> None:
    be = ScriptedBackend()
    be.choice_scores = {"A": [-2.0], "B": [-0.5]}

    @sgl.function
    def pick(s: Any) -> None:
        s += "Q"
        s += sgl.gen("g", choices=["A", "B"])

    assert pick.run(backend=be)["g"] == "B"


def test_normalized_logprob_matches_sglang() -> None:
    # None (first prompt token) and exact zeros are skipped
    assert normalized_logprob([[None, 1, "a"], [-1.0, 2, "b"], [0.0, 3, "c"], [-3.0, 4, "d"]]) == (
        pytest.approx(-2.0)
    )
    assert normalized_logprob([[None, 1, "a"]]) == -math.inf
    entries: List[List[Any]] = [[-1.0, 1, "A:"], [-2.0, 2, "x"], [-3.0, 3, "y"]]
    norm = normalized_logprob(entries)
    healed, new = heal_first_token("Q: A:", entries, norm)
    assert healed == entries[1:] and new == pytest.approx(-2.5)
    not_healed, same = heal_first_token("Q: B", entries, norm)
    assert not_healed == entries and same == norm


def test_dtype_regex_and_json_schema_payloads() -> None:
    be = ScriptedBackend("default")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    @sgl.function
    def prog(s: Any) -> None:
        s += sgl.gen("i", dtype=int)
        s += sgl.gen("r", regex=r"[a-z]+")
        s += sgl.gen("j", json_schema=schema)

    prog.run(backend=be).sync()
    i, r, j = (x["sampling_params"] for x in be.requests)
    assert i["regex"] == sgl.lang.ir.REGEX_INT and i["stop"] == [" ", "\n"]
    assert r["regex"] == "[a-z]+"
    assert json.loads(j["json_schema"]) == schema
    with pytest.raises(Exception):
        sgl.gen("bad", regex="(")


def test_streaming_text_iter() -> None:
    be = ScriptedBackend("default")

    @sgl.function
    def prog(s: Any) -> None:
        s += "Say: "
        s += sgl.gen("out", max_tokens=8)

    st = prog.run(backend=be, stream=True)
    assert "".join(st.text_iter("out")) == "Hello world"
    st2 = prog.run(backend=be, stream=True)
    assert "".join(st2.text_iter()) == "Say: Hello world"
    assert st2["out"] == "Hello world"


def test_run_batch_keeps_order_and_shows_progress(capsys: pytest.CaptureFixture[str]) -> None:
    be = ScriptedBackend("default")

    @sgl.function
    def prog(s: Any, i: int) -> None:
        s += f"item {i}:"
        s += sgl.gen("x", max_tokens=2)

    states = prog.run_batch([{"i": i} for i in range(64)], backend=be, progress_bar=True)
    assert [st.text().split(":")[0] for st in states] == [f"item {i}" for i in range(64)]
    assert len(be.requests) == 64
    assert "64/64" in capsys.readouterr().err
    states2 = prog.run_batch([[1], [2]], backend=be, num_threads=1)
    assert states2[1].text().startswith("item 2:")


def test_first_parameter_must_be_s() -> None:
    with pytest.raises(TypeError):
        sgl.function(lambda x: None)


def test_no_backend_is_a_clear_error() -> None:
    sgl.global_config.default_backend = None

    @sgl.function
    def prog(s: Any) -> None:
        s += "x"

    with pytest.raises(RuntimeError, match="set_default_backend"):
        prog.run()


SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are SmolLM<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)


def test_chat_template_from_jinja() -> None:
    smol = ChatTemplate.from_jinja("smol", jinja_renderer(SMOL_TEMPLATE))
    assert smol.role_prefix_and_suffix["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    assert smol.default_system_prompt == "You are SmolLM"
    assert smol.stop_str == ("<|im_end|>",)
    llama = ChatTemplate.from_jinja("l3", jinja_renderer(LLAMA3_TEMPLATE, bos_token=""))
    assert llama.role_prefix_and_suffix["assistant"] == (
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
    )
    assert llama.default_system_prompt is None
    # the derived template renders a conversation exactly as the Jinja template does
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert smol.get_prompt(
        [{"role": "system", "content": None}] + msgs
    ) == jinja_renderer(SMOL_TEMPLATE)(msgs)
