"""SGLang-style programs used by the acceptance tests, the compatibility check and the bench.

The module is written against the frontend API only: set ``SGL_MODULE=sglang`` to load it
under SGLang's own frontend (``import sglang as sgl``), the default is ``sglrs``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Dict, List

sgl: Any = importlib.import_module(os.environ.get("SGL_MODULE", "sglrs"))

FEW_SHOT = (
    "Answer each question with one word.\n\n"
    "Question: What color is the sky on a clear day?\nAnswer: Blue\n\n"
    "Question: What animal says moo?\nAnswer: Cow\n\n"
    "Question: What is frozen water called?\nAnswer: Ice\n\n"
)

PERSON_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

PHONE_REGEX = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"


@sgl.function
def few_shot_qa(s: Any, question: str) -> None:
    s += FEW_SHOT
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=8, stop="\n", temperature=0)


@sgl.function
def multi_turn_chat(s: Any, question_1: str, question_2: str) -> None:
    s += sgl.system("You are a helpful assistant. Answer briefly.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=24, temperature=0))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=24, temperature=0))


@sgl.function
def regex_phone(s: Any) -> None:
    s += "Here is the phone number of the office, in US format: "
    s += sgl.gen("phone", max_tokens=20, regex=PHONE_REGEX, temperature=0)


@sgl.function
def json_person(s: Any) -> None:
    s += sgl.user("Describe a fictional person as JSON with name, age and city.")
    s += sgl.assistant(
        sgl.gen("person", max_tokens=80, json_schema=_schema_arg(), temperature=0)
    )


def _schema_arg() -> str:
    import json

    return json.dumps(PERSON_SCHEMA)


@sgl.function
def select_capital(s: Any) -> None:
    s += "Question: What is the capital of France?\nAnswer: The capital of France is"
    s += sgl.select("city", choices=[" Paris", " a banana", " seventeen"])


@sgl.function
def fork_branches(s: Any, topic: str, branches: int = 4) -> None:
    s += FEW_SHOT * 4
    s += "Now three tips about " + topic + ".\n"
    forks = s.fork(branches)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:"
        f += sgl.gen("tip", max_tokens=12, stop="\n", temperature=0)
    forks.join()


@sgl.function
def tool_loop(s: Any, a: int, b: int, max_turns: int = 3) -> None:
    s += sgl.system(
        "You can use a calculator. Write calc(X*Y) to multiply two numbers; "
        "the result comes back as 'Result: N'."
    )
    s += sgl.user(f"What is {a} times {b}?")
    for _turn in range(max_turns):
        with s.assistant():
            s += "calc("
            s += sgl.gen("call", max_tokens=12, regex=r"[0-9]{1,4}\*[0-9]{1,4}", temperature=0)
            s += ")"
        x, y = (int(v) for v in s["call"].split("*"))
        s += sgl.user(f"Result: {x * y}")
        s += sgl.assistant(sgl.select("done", choices=["Done.", "More."]))
        if s["done"] == "Done.":
            break
    s += sgl.user("Now state the answer as a number.")
    s += sgl.assistant(sgl.gen("final", max_tokens=8, regex=r"[0-9]{1,8}", temperature=0))


@sgl.function
def short_answer(s: Any, i: int) -> None:
    s += f"Count from {i}: {i},"
    s += sgl.gen("next", max_tokens=4, temperature=0)


@sgl.function
def stream_story(s: Any) -> None:
    s += "Once upon a time, in a small village,"
    s += sgl.gen("story", max_tokens=32, temperature=0)


def compat_run(backend: Any) -> Dict[str, Any]:
    """Run the deterministic programs once and collect their outputs (for cross-frontend diffs)."""
    out: Dict[str, Any] = {}
    st = few_shot_qa.run(question="What is the opposite of hot?", backend=backend)
    out["few_shot"] = st["answer"]
    st = multi_turn_chat.run(
        question_1="What is 2+2?", question_2="And 3+3?", backend=backend
    )
    out["chat"] = [st["answer_1"], st["answer_2"]]
    out["regex"] = regex_phone.run(backend=backend)["phone"]
    out["json"] = json_person.run(backend=backend)["person"]
    out["select"] = select_capital.run(backend=backend)["city"]
    st = fork_branches.run(topic="sleep", backend=backend)
    out["fork"] = list(st["tip"])
    outs: List[str] = [
        s["next"] for s in short_answer.run_batch([{"i": i} for i in range(8)], backend=backend)
    ]
    out["batch"] = outs
    return out
