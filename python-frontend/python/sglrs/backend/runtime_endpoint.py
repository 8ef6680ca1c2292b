"""`RuntimeEndpoint`: run programs against a server over SGLang's native HTTP API.

Works with an sglrs server (`sglrs serve`) and with a real SGLang server: every request is a
plain `POST /generate` with SGLang's field names.
"""

from __future__ import annotations

import json
import threading
import warnings
from typing import Any, Dict, Iterator, Optional, Union

import requests

from sglrs.backend.base import BackendError, GenerateApiBackend
from sglrs.lang.chat_template import (
    ChatTemplate,
    chat_template_by_model_path,
    get_chat_template,
    jinja_renderer,
    read_local_chat_template,
)


class RuntimeEndpoint(GenerateApiBackend):
    """A backend that sends each generation to ``base_url`` over HTTP.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:30000"``.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        verify: TLS verification (a CA bundle path, or a bool), passed to `requests`.
        chat_template_name: use this registered template (e.g. ``"chatml"``) instead of the
            model's own.
        timeout: seconds to wait for one response (`None`: no limit).
    """

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        verify: Union[str, bool, None] = None,
        chat_template_name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.timeout = timeout
        self._local = threading.local()
        self.model_info: Dict[str, Any] = self._get("/get_model_info")
        self.chat_template = self._resolve_chat_template(chat_template_name)

    # -- chat template ---------------------------------------------------------------------

    def _resolve_chat_template(self, name: Optional[str]) -> ChatTemplate:
        if name:
            return get_chat_template(name)
        model_path = str(self.model_info.get("model_path", ""))
        source: Optional[str] = None
        bos = eos = ""
        served = self.model_info.get("chat_template")
        if isinstance(served, str) and served:
            source = served
            bos = str(self.model_info.get("bos_token") or "")
            eos = str(self.model_info.get("eos_token") or "")
        else:
            local = read_local_chat_template(model_path)
            if local is not None:
                source, bos, eos = local
        if source is not None:
            try:
                return ChatTemplate.from_jinja(
                    model_path or "served", jinja_renderer(source, bos, eos)
                )
            except Exception as e:  # noqa: BLE001 - any template failure falls back
                warnings.warn(
                    f"could not derive role prefixes from the model's chat template ({e}); "
                    "matching the model path instead",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return chat_template_by_model_path(model_path)

    # -- HTTP -----------------------------------------------------------------------------------

    def _session(self) -> requests.Session:
        sess: Optional[requests.Session] = getattr(self._local, "session", None)
        if sess is None:
            sess = requests.Session()
            if self.api_key:
                sess.headers["Authorization"] = f"Bearer {self.api_key}"
            self._local.session = sess
        return sess

    def _verify(self) -> Union[str, bool]:
        return True if self.verify is None else self.verify

    @staticmethod
    def _check(res: requests.Response) -> None:
        if res.status_code != 200:
            try:
                body: Any = res.json()
                if isinstance(body, dict) and isinstance(body.get("error"), dict):
                    body = body["error"].get("message", body)
            except ValueError:
                body = res.text
            raise BackendError(str(body), res.status_code)

    def _get(self, path: str) -> Any:
        try:
            res = self._session().get(
                self.base_url + path, timeout=self.timeout, verify=self._verify()
            )
        except requests.RequestException as e:
            raise BackendError(f"cannot reach {self.base_url}{path}: {e}") from e
        self._check(res)
        return res.json()

    def _post(self, path: str, payload: Dict[str, Any]) -> Any:
        try:
            res = self._session().post(
                self.base_url + path, json=payload, timeout=self.timeout, verify=self._verify()
            )
        except requests.RequestException as e:
            raise BackendError(f"cannot reach {self.base_url}{path}: {e}") from e
        self._check(res)
        return res.json() if res.content else None

    def _request(self, payload: Dict[str, Any]) -> Any:
        return self._post("/generate", payload)

    def _request_stream(self, payload: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        try:
            res = self._session().post(
                self.base_url + "/generate",
                json=payload,
                stream=True,
                timeout=self.timeout,
                verify=self._verify(),
            )
        except requests.RequestException as e:
            raise BackendError(f"cannot reach {self.base_url}/generate: {e}") from e
        with res:
            self._check(res)
            for raw in res.iter_lines(decode_unicode=False):
                line = raw.decode("utf-8")
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event:
                    raise BackendError(str(event["error"]))
                yield event

    # -- the rest of the backend interface ------------------------------------------------------

    def get_model_name(self) -> str:
        """The model path the server reports."""
        return str(self.model_info.get("model_path", ""))

    def flush_cache(self) -> None:
        try:
            res = self._session().post(
                self.base_url + "/flush_cache", timeout=self.timeout, verify=self._verify()
            )
        except requests.RequestException as e:
            raise BackendError(f"cannot reach {self.base_url}/flush_cache: {e}") from e
        self._check(res)

    def get_server_info(self) -> Dict[str, Any]:
        info = self._get("/get_server_info")
        return dict(info) if isinstance(info, dict) else {"info": info}
