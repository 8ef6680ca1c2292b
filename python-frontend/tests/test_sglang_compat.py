"""The same program file gives the same output under sglrs' and SGLang's frontends.

Runs `compat_runner.py` under ``import sglrs as sgl`` (this interpreter) and under
``import sglang as sgl`` (the interpreter in ``SGLANG_PYTHON``, default
``/tmp/sglfront/bin/python``; see docs/python.md for the install), both against the same
sglrs server, at temperature 0, and compares every output. Skipped when SGLang's frontend is
not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SGLANG_PYTHON = os.environ.get("SGLANG_PYTHON", "/tmp/sglfront/bin/python")


def _has_sglang() -> bool:
    if not Path(SGLANG_PYTHON).exists():
        return False
    r = subprocess.run(
        [SGLANG_PYTHON, "-c", "import sglang; sglang.RuntimeEndpoint"],
        capture_output=True,
        timeout=300,
    )
    return r.returncode == 0


def _run(python: str, url: str, module: str) -> Any:
    r = subprocess.run(
        [python, str(HERE / "compat_runner.py"), url, module],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, f"{module} run failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_same_outputs_as_sglang_frontend(sglrs_server: Any) -> None:
    if not _has_sglang():
        pytest.skip(f"SGLang's frontend is not importable by {SGLANG_PYTHON}")
    ours = _run(sys.executable, sglrs_server.url, "sglrs")
    theirs = _run(SGLANG_PYTHON, sglrs_server.url, "sglang")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key] == theirs[key], f"{key}: sglrs {ours[key]!r} != sglang {theirs[key]!r}"
