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


def _passes(engine_backend: Any) -> int:
    """Forward passes so far, once the scheduler has published its last step: its stats
    snapshot follows the events by a moment, so wait until it is idle and steady."""
    last = None
    for _ in range(100):
        st = engine_backend.get_server_info()["internal_states"][0]
        idle = st["num_running_reqs"] == 0 and st["num_waiting_reqs"] == 0
        if idle and st["forward_passes"] == last:
            break
        last = st["forward_passes"] if idle else None
        time.sleep(0.15)
    return int(st["forward_passes"])


def test_direct_path_answers_like_the_router(engine_backend: Any) -> None:
    # A plain body takes the direct path; the same body with a (null) `rid` goes through the
    # server's router. Same prompt tokens, same greedy output, same answer shape.
    body = {
        "text": P.FEW_SHOT + "Question: What is the opposite of hot?\nAnswer:",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "stop": "\n"},
    }
    direct = engine_backend.generate_raw(body)
    routed = engine_backend.generate_raw({**body, "rid": None})
    assert direct["text"] == routed["text"]
    assert direct["output_ids"] == routed["output_ids"]
    assert set(direct["meta_info"]) == set(routed["meta_info"])
    for k in ("prompt_tokens", "completion_tokens", "finish_reason"):
        assert direct["meta_info"][k] == routed["meta_info"][k], k
    # n > 1 answers a list, as the route does
    many = engine_backend.generate_raw(
        {"text": "Count: 1, 2,", "sampling_params": {"max_new_tokens": 3, "n": 2, "temperature": 0}}
    )
    assert isinstance(many, list) and len(many) == 2 and many[0]["text"] == many[1]["text"]


def test_submit_group_is_one_scheduler_step(engine_backend: Any) -> None:
    # Four branches submitted as one group are admitted in the same step: after the shared
    # prefix is cached, 16 tokens each take 16 forward passes in all (1 prefill + 15 decodes).
    # Seeded sampling rather than greedy, so that no branch drafts tokens and saves passes.
    import json

    native = engine_backend._engine
    prefix = f"Group test {time.time_ns()}.\n" + P.FEW_SHOT
    engine_backend.generate_raw({"text": prefix, "sampling_params": {"max_new_tokens": 0}})
    bodies = [
        json.dumps({
            "text": prefix + f"Item {i}:",
            "sampling_params": {"max_new_tokens": 16, "temperature": 0.7, "sampling_seed": 7,
                                "ignore_eos": True},
        })
        for i in range(4)
    ]
    before = _passes(engine_backend)
    answers = [json.loads(p.wait()) for p in native.submit_group(bodies)]
    assert _passes(engine_backend) - before == 16
    assert all(a["meta_info"]["completion_tokens"] == 16 for a in answers)
    assert all(a["meta_info"]["cached_tokens"] > 0 for a in answers)
    # each answer is what the same request gives alone
    alone = engine_backend.generate_raw(json.loads(bodies[2]))
    assert alone["output_ids"] == answers[2]["output_ids"]


def test_submit_group_member_errors_stay_their_own(engine_backend: Any) -> None:
    import json

    native = engine_backend._engine
    good = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
    bad = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": -1}})
    routed = json.dumps({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1}})
    p_good, p_bad, p_routed = native.submit_group([good, bad, routed])
    assert json.loads(p_good.wait())["meta_info"]["completion_tokens"] == 2
    with pytest.raises(ValueError, match="max_new_tokens"):
        p_bad.wait()
    assert len(json.loads(p_routed.wait())) == 2
    with pytest.raises(RuntimeError, match="already"):
        p_good.wait()


def test_fork_branches_decode_together(engine_backend: Any) -> None:
    # A fork's branches reach the scheduler as one group: 4 branches x 12 tokens cost the
    # commit's pass plus 12 (1 prefill + 11 decodes), not a staggered start. The program
    # hands the branches their work a few ms apart: without the group, the first branch
    # would start a step alone and the others join one step later (1 + 13 passes). Sampled
    # (T > 0), so that no branch drafts tokens (greedy ones may, and then need fewer passes).
    @sgl.function
    def four(s: Any, prefix: str) -> None:
        s += prefix
        forks = s.fork(4)
        for i, f in enumerate(forks):
            f += f"Option {i}:"
            f += sgl.gen("x", max_tokens=12, temperature=0.7, ignore_eos=True)
            time.sleep(0.003)
        forks.join()

    before = _passes(engine_backend)
    st = four.run(prefix=f"Fork test {time.time_ns()}.\n" + P.FEW_SHOT, backend=engine_backend)
    assert len(st["x"]) == 4 and st.error() is None
    assert _passes(engine_backend) - before == 1 + 12
