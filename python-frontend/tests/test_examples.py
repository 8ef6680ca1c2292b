"""The examples under ``python-frontend/examples`` run against a real server."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.server
def test_agent_calls_tools_with_valid_arguments_and_answers(sglrs_server: Any) -> None:
    import sglrs as sgl

    agent = load("agent")
    sgl.set_default_backend(sgl.RuntimeEndpoint(sglrs_server.url))
    for question in ("What is 12 times 7?", "What's the weather in Lisbon?"):
        state = agent.agent.run(question=question, max_steps=3)
        steps = agent.steps(state)
        # Whatever the model picks, every call names a tool, its arguments follow the
        # tool's schema (enforced), and its result went back into the conversation.
        for st in steps:
            desc, schema, fn = agent.TOOLS[st["tool"]]
            jsonschema.validate(st["arguments"], schema)
            assert st["result"] == fn(**st["arguments"])
            assert f"Result of {st['tool']}: {st['result']}" in state.text()
        assert "answer" in state
        # The conversation grew step by step over one prefix: later steps hit the cache.
        if steps:
            assert state.get_meta_info(f"args_{len(steps) - 1}")["cached_tokens"] > 0


@pytest.mark.server
def test_agent_example_runs_from_the_command_line(sglrs_server: Any) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "agent.py"), "--url", sglrs_server.url,
                          "What is 3 plus 4?"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "answer:" in out.stdout
