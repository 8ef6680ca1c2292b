"""The in-process Engine: same answers as the server, shared cache, GIL released, clean errors."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import sglrs as sgl

import programs as P


def test_engine_answers_like_the_server(engine_backend: Any, http_backend: Any) -> None:
    body = {
        "text": P.FEW_SHOT + "Question: What is the opposite of up?\nAnswer:",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "stop": "\n"},
    }
    ours = engine_backend.generate_raw(body)
    theirs = http_backend._request(body)
    assert ours["text"] == theirs["text"]
    assert ours["output_ids"] == theirs["output_ids"]
    assert ours["meta_info"]["prompt_tokens"] == theirs["meta_info"]["prompt_tokens"]
    # the same program text gives the same output in-process and over HTTP
    a = P.multi_turn_chat.run(question_1="Hi!", question_2="Name a color.", backend=engine_backend)
    b = P.multi_turn_chat.run(question_1="Hi!", question_2="Name a color.", backend=http_backend)
    assert a.text() == b.text()


def test_engine_reuses_cache_across_calls(engine_backend: Any) -> None:
    prompt = P.FEW_SHOT * 3 + "Question: Name a fruit.\nAnswer:"
    first = engine_backend.generate_raw({"text": prompt, "sampling_params": {"max_new_tokens": 1}})
    again = engine_backend.generate_raw({"text": prompt, "sampling_params": {"max_new_tokens": 1}})
    assert again["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 16


def test_engine_releases_the_gil(engine_backend: Any) -> None:
    # While a generation runs in another thread, this thread keeps running Python code.
    done = threading.Event()

    def work() -> None:
        engine_backend.generate_raw(
            {"text": "Tell me a story.", "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}
        )
        done.set()

    t = threading.Thread(target=work)
    t.start()
    ticks = 0
    start = time.perf_counter()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    elapsed = time.perf_counter() - start
    t.join()
    # a GIL held for the whole call would leave this loop at most a tick or two
    assert ticks > 10 and elapsed > 0.02, (ticks, elapsed)


def test_engine_bad_input_is_a_clear_error(engine_backend: Any) -> None:
    with pytest.raises(sgl.BackendError, match="max_new_tokens"):
        engine_backend.generate_raw({"text": "x", "sampling_params": {"max_new_tokens": -1}})
    with pytest.raises(sgl.BackendError, match="regex"):
        engine_backend.generate_raw({"text": "x", "sampling_params": {"regex": "("}})


def test_engine_settings_are_checked() -> None:
    with pytest.raises(sgl.BackendError, match="no_such_setting|no-such-setting"):
        sgl.Engine(model_path=str(P.__file__), no_such_setting=1)
