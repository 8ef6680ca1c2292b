"""A tool-using agent as an SGLang program: `select` picks the next tool (or the answer),
`gen` with the tool's JSON Schema writes its arguments, Python runs the tool, and the result
goes back into the conversation for the next step.

Every step extends the same conversation, so its prefix comes from the server's radix cache;
each tool's arguments are valid by construction (the schema is enforced token by token).

    python examples/agent.py --url http://127.0.0.1:30000 "What is 12 times 7, plus 5?"

The program is written against the frontend API only: it runs under ``import sglang as sgl``
too (set ``SGL_MODULE=sglang``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from typing import Any, Callable, Dict, List, Tuple

sgl: Any = importlib.import_module(os.environ.get("SGL_MODULE", "sglrs"))

NUMBER = {"type": "number", "minimum": -1e9, "maximum": 1e9}

#: name → (what it does, JSON Schema of its arguments, the function).
TOOLS: Dict[str, Tuple[str, Dict[str, Any], Callable[..., Any]]] = {
    "add": ("Add two numbers.",
            {"type": "object", "properties": {"a": NUMBER, "b": NUMBER},
             "required": ["a", "b"], "additionalProperties": False},
            lambda a, b: a + b),
    "multiply": ("Multiply two numbers.",
                 {"type": "object", "properties": {"a": NUMBER, "b": NUMBER},
                  "required": ["a", "b"], "additionalProperties": False},
                 lambda a, b: a * b),
    "weather": ("Today's weather in a city.",
                {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                 "required": ["city"], "additionalProperties": False},
                lambda city: f"18 C and sunny in {city}"),
}

ANSWER = "answer"


def tool_list() -> str:
    return "\n".join(f"- {name}: {desc} Arguments: {json.dumps(schema['properties'])}"
                     for name, (desc, schema, _) in TOOLS.items())


@sgl.function
def agent(s: Any, question: str, max_steps: int = 3) -> None:
    s += sgl.system("You solve tasks with tools. Tools:\n" + tool_list() +
                    f"\nEach step, name one tool and give its arguments as JSON, "
                    f"or say {ANSWER} to reply.")
    s += sgl.user(question)
    for step in range(max_steps):
        s += sgl.assistant_begin()
        s += "Next: " + sgl.select(f"tool_{step}", choices=[*TOOLS, ANSWER])
        name = s[f"tool_{step}"]
        if name == ANSWER:
            s += "\n" + sgl.gen("answer", max_tokens=48, stop="\n", temperature=0)
            s += sgl.assistant_end()
            return
        s += "\nArguments: " + sgl.gen(f"args_{step}", max_tokens=48, temperature=0,
                                       json_schema=TOOLS[name][1])
        s += sgl.assistant_end()
        args = json.loads(s[f"args_{step}"])
        result = TOOLS[name][2](**args)
        s.set_var(f"result_{step}", result)
        s += sgl.user(f"Result of {name}: {result}")
    s += sgl.assistant("I could not finish in time." + sgl.gen("answer", max_tokens=1))


def steps(state: Any) -> List[Dict[str, Any]]:
    """The tools an agent run called, with their arguments and results."""
    out = []
    for step in range(16):
        if f"tool_{step}" not in state:
            break
        name = state[f"tool_{step}"]
        if name == ANSWER:
            break
        out.append({"tool": name, "arguments": json.loads(state[f"args_{step}"]),
                    "result": state[f"result_{step}"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("question", nargs="?", default="What is 12 times 7?")
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--max-steps", type=int, default=3)
    a = ap.parse_args()
    sgl.set_default_backend(sgl.RuntimeEndpoint(a.url))
    state = agent.run(question=a.question, max_steps=a.max_steps)
    for st in steps(state):
        print(f"{st['tool']}({json.dumps(st['arguments'])}) -> {st['result']}")
    print("answer:", state["answer"])


if __name__ == "__main__":
    main()
