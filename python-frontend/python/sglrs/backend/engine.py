"""`Engine`: the sglrs runtime inside this Python process, as a program backend.

The native engine (`sglrs._native.Engine`, PyO3) loads the model, starts the scheduler thread
and answers SGLang-native `/generate` request objects directly — no HTTP, no serialisation
through a socket. Generation releases the GIL, so the worker threads of forked branches and
`run_batch` submit concurrently and the scheduler batches them; all requests share one radix
cache, so a fork's prefix is computed once and repeated calls reuse it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional

from sglrs import _native
from sglrs.backend.base import BackendError, GenerateApiBackend
from sglrs.lang.chat_template import (
    ChatTemplate,
    chat_template_by_model_path,
    get_chat_template,
)


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
            return json.loads(self._engine.generate(json.dumps(payload)))
        except ValueError as e:
            if isinstance(e, json.JSONDecodeError):
                raise
            raise BackendError(str(e), 400) from e
        except RuntimeError as e:
            raise BackendError(str(e), 500) from e

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
