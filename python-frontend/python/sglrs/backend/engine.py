"""`Engine`: the sglrs runtime inside this Python process, as a program backend.

The native engine (`sglrs._native.Engine`, PyO3) loads the model, starts the scheduler thread
and answers SGLang-native `/generate` request objects directly — no HTTP, no serialisation
through a socket. Generation releases the GIL, so the worker threads of forked branches and
`run_batch` submit concurrently and the scheduler batches them; all requests share one radix
cache, so a fork's prefix is computed once and repeated calls reuse it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from sglrs import _native
from sglrs.backend.base import BackendError, GenerateApiBackend, MetaInfo, generate_result
from sglrs.lang.chat_template import (
    ChatTemplate,
    chat_template_by_model_path,
    get_chat_template,
)
from sglrs.lang.ir import SamplingParams

if TYPE_CHECKING:
    from sglrs.lang.choices import ChoicesDecision, ChoicesSamplingMethod
    from sglrs.lang.interpreter import StreamExecutor

#: How long the first request of a group waits for its siblings' before going alone.
GROUP_WINDOW_S = 0.02


def _engine_error(e: Exception) -> BackendError:
    if isinstance(e, ValueError):
        return BackendError(str(e), 400)
    return BackendError(str(e), 500)


class _Slot:
    __slots__ = ("body", "pending", "error")

    def __init__(self, body: str) -> None:
        self.body = body
        self.pending: Any = None
        self.error: Optional[BaseException] = None


class SubmitGroup:
    """The first requests of states started together (a fork's branches, a batch's programs).

    Each member's first generation waits until every member has sent its own (or left: its
    first request was of another kind, or it ended), or at most `window` seconds, then the
    waiting ones go to the scheduler in one message and are admitted in the same step. Each
    member then waits only for its own answer. Requests are unchanged: grouping only decides
    when they reach the scheduler.
    """

    def __init__(self, engine: Any, size: int, window: float = GROUP_WINDOW_S) -> None:
        self._engine = engine
        self._expected = size
        self._window = window
        self._cond = threading.Condition()
        self._batch: List[_Slot] = []
        self._done = 0  # members that sent or left

    def submit(self, body: str) -> Any:
        """Queue `body`; returns its `PendingGenerate` once the group was submitted."""
        slot = _Slot(body)
        with self._cond:
            self._batch.append(slot)
            self._done += 1
            if self._done >= self._expected:
                self._flush()
            else:
                deadline = time.monotonic() + self._window
                while slot.pending is None and slot.error is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._flush()
                        break
                    self._cond.wait(left)
        if slot.error is not None:
            raise slot.error
        return slot.pending

    def leave(self) -> None:
        """A member will not send a grouped request."""
        with self._cond:
            self._done += 1
            if self._done >= self._expected:
                self._flush()

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch:
            try:
                pendings = self._engine.submit_group([s.body for s in batch])
            except Exception as e:  # noqa: BLE001 - handed to every member
                for s in batch:
                    s.error = e
            else:
                for s, p in zip(batch, pendings):
                    s.pending = p
        self._cond.notify_all()


class Engine(GenerateApiBackend):
    """Run programs on a model loaded in this process.

    Args:
        model_path: a GGUF file or an HF folder (default: the bundled default model).
        chat_template_name: use this registered template instead of the model's own.
        **kwargs: engine settings (e.g. ``page_size``, ``kv_tokens``, ``threads``); see
            `sglrs._native.Engine` for the list. Unknown names are an error.
    """

    def __init__(
        self,
        model_path: Optional[str] = None,
        chat_template_name: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        config = json.dumps({k: v for k, v in kwargs.items() if v is not None})
        try:
            self._engine = _native.Engine(model_path, config)
        except ValueError as e:
            raise BackendError(str(e), 400) from e
        self.model_path = self._engine.model_path()
        self.chat_template = self._resolve_chat_template(chat_template_name)

    def _resolve_chat_template(self, name: Optional[str]) -> ChatTemplate:
        if name:
            return get_chat_template(name)
        def render(messages: List[Dict[str, str]]) -> str:
            out = self._engine.render_chat(json.dumps(messages))
            if out is None:
                raise ValueError("the model has no chat template")
            return str(out)

        if self._engine.render_chat("[]") is not None:
            try:
                return ChatTemplate.from_jinja(self.model_path, render)
            except Exception:  # noqa: BLE001 - fall back like the HTTP backend
                pass
        return chat_template_by_model_path(self.model_path)

    def _request(self, payload: Dict[str, Any]) -> Any:
        try:
            answer = self._engine.generate(json.dumps(payload))
        except (ValueError, RuntimeError) as e:
            raise _engine_error(e) from e
        return json.loads(answer)

    # -- submit groups ----------------------------------------------------------------------

    def open_group(self, size: int) -> Optional[SubmitGroup]:
        return SubmitGroup(self._engine, size) if size > 1 else None

    @staticmethod
    def _take_group(s: "StreamExecutor") -> Optional[SubmitGroup]:
        group = getattr(s, "submit_group", None)
        if group is not None:
            s.submit_group = None
        return group if isinstance(group, SubmitGroup) else None

    def _leave_group(self, s: "StreamExecutor") -> None:
        group = self._take_group(s)
        if group is not None:
            group.leave()

    def generate(self, s: "StreamExecutor", params: SamplingParams) -> Tuple[str, MetaInfo]:
        group = self._take_group(s)
        if group is None:
            return super().generate(s, params)
        body = json.dumps(self.build_generate_payload(s.text_, params))
        try:
            obj = json.loads(group.submit(body).wait())
        except (ValueError, RuntimeError) as e:
            if isinstance(e, json.JSONDecodeError):
                raise
            raise _engine_error(e) from e
        return generate_result(obj)

    def generate_stream(
        self, s: "StreamExecutor", params: SamplingParams
    ) -> Iterator[Tuple[str, MetaInfo]]:
        self._leave_group(s)
        return super().generate_stream(s, params)

    def select(
        self,
        s: "StreamExecutor",
        choices: List[str],
        temperature: float,
        choices_method: "ChoicesSamplingMethod",
    ) -> "ChoicesDecision":
        self._leave_group(s)
        return super().select(s, choices, temperature, choices_method)

    def commit_lazy_operations(self, s: "StreamExecutor") -> None:
        self._leave_group(s)
        super().commit_lazy_operations(s)

    def end_program(self, s: "StreamExecutor") -> None:
        self._leave_group(s)

    def _request_stream(self, payload: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        try:
            stream = self._engine.generate_stream(json.dumps(payload))
        except ValueError as e:
            raise BackendError(str(e), 400) from e
        for event in stream:
            obj = json.loads(event)
            if isinstance(obj, dict) and "error" in obj:
                raise BackendError(str(obj["error"]))
            yield obj

    def generate_raw(self, payload: Dict[str, Any]) -> Any:
        """Answer one SGLang-native `/generate` request object (as `POST /generate` would)."""
        return self._request(payload)

    def get_model_name(self) -> str:
        """The loaded model's path."""
        return self.model_path

    def flush_cache(self) -> None:
        if not self._engine.flush_cache():
            raise BackendError("cannot flush the cache while requests are running", 409)

    def get_server_info(self) -> Dict[str, Any]:
        return dict(json.loads(self._engine.server_info()))

    def shutdown(self) -> None:
        self._engine.shutdown()
