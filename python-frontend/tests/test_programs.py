"""Acceptance: SGLang-style programs on the real default model, once per backend.

`backend` is an `sgl.RuntimeEndpoint` on a real `sglrs serve` process, then the in-process
`sgl.Engine`; each is skipped with its reason when it is not available (see conftest.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

import programs as P


def test_few_shot_qa(backend: Any) -> None:
    st = P.few_shot_qa.run(question="What is the opposite of hot?", backend=backend)
    answer = st["answer"]
    assert isinstance(answer, str) and answer.strip(), st.text()
    assert "\n" not in answer
    assert st.text().endswith("Answer:" + answer)
    # Greedy decoding is deterministic, and the second run reuses the few-shot prefix.
    st2 = P.few_shot_qa.run(question="What is the opposite of hot?", backend=backend)
    assert st2["answer"] == answer
    meta = st2.get_meta_info("answer")
    assert meta["cached_tokens"] >= meta["prompt_tokens"] - 16, meta


def test_multi_turn_chat(backend: Any) -> None:
    st = P.multi_turn_chat.run(question_1="What is 2+2?", question_2="And 3+3?", backend=backend)
    msgs = st.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == "What is 2+2?"
    assert msgs[2]["content"] == st["answer_1"].lstrip()
    assert msgs[4]["content"] == st["answer_2"].lstrip()
    # the roles are written in the model's own chat template (SmolLM2: ChatML)
    tpl = backend.get_chat_template()
    pre, suf = tpl.role_prefix_and_suffix["user"]
    assert pre + "And 3+3?" + suf in st.text()
    assert "<|im_start|>user\n" == pre


def test_regex_constrained_gen(backend: Any) -> None:
    st = P.regex_phone.run(backend=backend)
    assert re.fullmatch(P.PHONE_REGEX, st["phone"]), st["phone"]


def test_json_schema_constrained_gen(backend: Any) -> None:
    st = P.json_person.run(backend=backend)
    obj = json.loads(st["person"])
    jsonschema.validate(obj, P.PERSON_SCHEMA)


def test_select_returns_highest_scoring_choice(backend: Any) -> None:
    st = P.select_capital.run(backend=backend)
    choices = [" Paris", " a banana", " seventeen"]
    city = st["city"]
    assert city in choices
    meta = st.get_meta_info("city")
    scores = meta["normalized_prompt_logprobs"]
    assert len(scores) == 3 and all(s < 0 for s in scores)
    assert city == choices[max(range(3), key=lambda i: scores[i])]
    assert city == " Paris"


def test_fork_computes_shared_prefix_once(backend: Any) -> None:
    @P.sgl.function
    def tree(s: Any) -> None:
        s += P.FEW_SHOT * 4 + "Now four tips about sleep.\n"
        forks = s.fork(4)
        forks += lambda i: f"Tip {i + 1}:"
        forks += P.sgl.gen("tip", max_tokens=12, stop="\n", temperature=0)
        s["branches"] = forks
        forks.join()

    st = tree.run(backend=backend)
    tips = st["tip"]
    assert isinstance(tips, list) and len(tips) == 4
    for branch in st["branches"]:
        meta = branch.get_meta_info("tip")
        # Every branch finds the prefix (committed once before the fork) in the cache:
        # all but the branch's own few tokens and the last partial page are cached.
        assert meta["cached_tokens"] >= meta["prompt_tokens"] - 24, meta
        assert meta["prompt_tokens"] > 200


def test_tool_use_loop(backend: Any) -> None:
    st = P.tool_loop.run(a=12, b=7, backend=backend)
    call = st["call"]
    assert re.fullmatch(r"[0-9]{1,4}\*[0-9]{1,4}", call)
    x, y = (int(v) for v in call.split("*"))
    text = st.text()
    assert f"Result: {x * y}" in text
    assert st["done"] in ("Done.", "More.")
    assert re.fullmatch(r"[0-9]{1,8}", st["final"])
    roles = [m["role"] for m in st.messages()]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "assistant"


def test_run_batch_64(backend: Any) -> None:
    states = P.short_answer.run_batch(
        [{"i": i} for i in range(64)], backend=backend, progress_bar=True
    )
    assert len(states) == 64
    for i, st in enumerate(states):
        assert st.error() is None
        assert st.text().startswith(f"Count from {i}: {i},")
        assert isinstance(st["next"], str)
        assert st.get_meta_info("next")["completion_tokens"] >= 1
    # the same program at temperature 0 gives the same answer whether batched or not
    alone = P.short_answer.run(i=5, backend=backend)
    assert alone["next"] == states[5]["next"]


def test_streaming(backend: Any) -> None:
    st = P.stream_story.run(backend=backend, stream=True)
    chunks = list(st.text_iter("story"))
    assert len(chunks) > 1
    streamed = "".join(chunks)
    assert streamed == st["story"]
    plain = P.stream_story.run(backend=backend)
    assert plain["story"] == streamed
    st2 = P.stream_story.run(backend=backend, stream=True)
    assert "".join(st2.text_iter()) == plain.text()


def test_server_errors_are_reported(backend: Any) -> None:
    @P.sgl.function
    def bad(s: Any) -> None:
        s += "x"
        s += P.sgl.gen("y", max_tokens=-5)

    with pytest.warns(RuntimeWarning):
        st = bad.run(backend=backend)
        err = st.error()
    assert err is not None and "max_new_tokens" in str(err)
