"""Fixtures: a real `sglrs serve` process on a free loopback port, and the backends under test.

The server binary comes from ``SGLRS_BIN``, else ``$CARGO_TARGET_DIR/release/sglrs``, else
``target/release/sglrs`` at the repository root; the model from ``SGLRS_MODEL``, else the
default model under ``models/``. Tests that need them are skipped, saying why, when the
binary or the model is missing. A server that exists but does not come up is a failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional, Set

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
STARTUP_TIMEOUT_S = float(os.environ.get("SGLRS_STARTUP_TIMEOUT", "300"))


def server_binary() -> Optional[Path]:
    """Where the `sglrs` binary should be (whether or not it exists)."""
    explicit = os.environ.get("SGLRS_BIN")
    if explicit:
        return Path(explicit)
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        return Path(target) / "release" / "sglrs"
    return REPO / "target" / "release" / "sglrs"


def model_path() -> Path:
    """The model the tests serve."""
    return Path(os.environ.get("SGLRS_MODEL", str(DEFAULT_MODEL)))


_GIVEN: Set[int] = set()


def free_port() -> int:
    """A free loopback port this process was not given before (the OS may hand a
    just-released port out again: two servers on one port do not both start)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no port not given before in 100 tries")


class ServerProcess:
    """A running `sglrs serve`; `url` is its base URL."""

    def __init__(self, binary: Path, model: Path, extra: List[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(
            prefix="sglrs-serve-", suffix=".log", delete=False
        )
        cmd = [
            str(binary),
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            data = f.read()
        return data[-n:].decode("utf-8", "replace")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sglrs serve exited with {self.proc.returncode} before /health:\n"
                    + self.log_tail()
                )
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"sglrs serve did not answer /health in {STARTUP_TIMEOUT_S:.0f} s:\n"
            + self.log_tail()
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


@pytest.fixture(scope="session")
def sglrs_server() -> Iterator[ServerProcess]:
    """One `sglrs serve` for the whole session (skips if the binary or model is missing)."""
    url = os.environ.get("SGLRS_URL")
    if url:
        # An already running server (e.g. started by hand): use it as is.
        class External(ServerProcess):
            def __init__(self) -> None:
                self.url = url.rstrip("/")  # type: ignore[union-attr]

            def stop(self) -> None:
                pass

        yield External()
        return
    binary = server_binary()
    if binary is None or not binary.exists():
        pytest.skip(
            f"sglrs binary not found at {binary}: build it (cargo build --release -p "
            "sglrs-runtime) or set SGLRS_BIN / SGLRS_URL"
        )
    model = model_path()
    if not model.exists():
        pytest.skip(f"model not found at {model}: run scripts/fetch-model.sh or set SGLRS_MODEL")
    server = ServerProcess(binary, model, os.environ.get("SGLRS_SERVE_ARGS", "").split())
    try:
        yield server
    finally:
        server.stop()
        if os.environ.get("SGLRS_KEEP_LOG"):
            sys.stderr.write(f"server log: {server.log.name}\n")
        else:
            os.unlink(server.log.name)


def _native_engine_available() -> bool:
    try:
        from sglrs import _native
    except ImportError:
        return False
    return hasattr(_native, "Engine")


@pytest.fixture(scope="session")
def http_backend(sglrs_server: ServerProcess) -> "object":
    import sglrs as sgl

    return sgl.RuntimeEndpoint(sglrs_server.url)


@pytest.fixture(scope="session")
def engine_backend() -> Iterator["object"]:
    if not _native_engine_available():
        pytest.skip("this build of sglrs has no in-process Engine (sglrs._native.Engine)")
    model = model_path()
    if not model.exists():
        pytest.skip(f"model not found at {model}")
    import sglrs as sgl

    engine = sgl.Engine(model_path=str(model))  # type: ignore[attr-defined]
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(params=["http", "engine"])
def backend(request: pytest.FixtureRequest) -> "object":
    """Each acceptance test runs once per backend."""
    if request.param == "http":
        return request.getfixturevalue("http_backend")
    return request.getfixturevalue("engine_backend")
