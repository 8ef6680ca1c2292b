"""What a backend does for the interpreter, and the shared logic of native-API backends.

`BaseBackend` is the interface the interpreter calls. `GenerateApiBackend` implements it on
top of one primitive — "send this SGLang-native `/generate` request, give me the JSON
response" — so the HTTP backend (`RuntimeEndpoint`) and the in-process one (`Engine`) send
byte-for-byte the same requests and score `select` the same way.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from sglrs.lang.chat_template import ChatTemplate, get_chat_template
from sglrs.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    heal_first_token,
    normalized_logprob,
)
from sglrs.lang.ir import SamplingParams

if TYPE_CHECKING:
    from sglrs.lang.interpreter import StreamExecutor

MetaInfo = Dict[str, Any]


class BackendError(RuntimeError):
    """A backend refused or failed a request; `status` is the HTTP status when there is one."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class BaseBackend(abc.ABC):
    """The operations the interpreter needs from a model backend."""

    chat_template: ChatTemplate = get_chat_template("default")

    def get_chat_template(self) -> ChatTemplate:
        """The chat template roles are written with."""
        return self.chat_template

    @abc.abstractmethod
    def generate(self, s: "StreamExecutor", params: SamplingParams) -> Tuple[str, MetaInfo]:
        """Continue `s.text_`; return the new text and the backend's `meta_info`."""

    @abc.abstractmethod
    def generate_stream(
        self, s: "StreamExecutor", params: SamplingParams
    ) -> Iterator[Tuple[str, MetaInfo]]:
        """Like `generate`, yielding the new text piece by piece."""

    @abc.abstractmethod
    def select(
        self,
        s: "StreamExecutor",
        choices: List[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        """Pick one of `choices` to follow `s.text_`."""

    def cache_prefix(self, prefix: str) -> None:
        """Compute and cache `prefix` without generating."""

    def commit_lazy_operations(self, s: "StreamExecutor") -> None:
        """Compute and cache `s.text_` (called before a fork)."""
        self.cache_prefix(s.text_)

    def end_program(self, s: "StreamExecutor") -> None:
        """A program state ended; release anything kept for it."""

    def open_group(self, size: int) -> Optional[Any]:
        """A token linking `size` states that start together (a fork's branches, a batch's
        programs), or `None`. The interpreter stores it as each state's `submit_group`; a
        backend that can hand their first requests to its scheduler as one group (admitted in
        the same step) uses it, and must never let a member wait on one that does not come."""
        return None

    def flush_cache(self) -> None:
        """Empty the prefix cache."""

    def get_server_info(self) -> Dict[str, Any]:
        """What the backend says about itself."""
        return {}

    def shutdown(self) -> None:
        """Release the backend's resources."""


class GenerateApiBackend(BaseBackend):
    """A backend that speaks SGLang's native `/generate` request and response shapes."""

    @abc.abstractmethod
    def _request(self, payload: Dict[str, Any]) -> Any:
        """Send one `/generate` request; return the decoded JSON response."""

    @abc.abstractmethod
    def _request_stream(self, payload: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        """Send one streaming `/generate` request; yield each decoded event object."""

    @staticmethod
    def build_generate_payload(text: str, params: SamplingParams) -> Dict[str, Any]:
        """The `/generate` request for continuing `text` with `params` (dtype applied)."""
        p = SamplingParams().merged(params)
        p.apply_dtype()
        payload: Dict[str, Any] = {"text": text, "sampling_params": p.to_srt_kwargs()}
        payload.update(p.logprob_kwargs())
        return payload

    def generate(self, s: "StreamExecutor", params: SamplingParams) -> Tuple[str, MetaInfo]:
        return generate_result(self._request(self.build_generate_payload(s.text_, params)))

    def generate_stream(
        self, s: "StreamExecutor", params: SamplingParams
    ) -> Iterator[Tuple[str, MetaInfo]]:
        payload = self.build_generate_payload(s.text_, params)
        payload["stream"] = True
        pos = 0
        for event in self._request_stream(payload):
            text = str(event.get("text", ""))
            chunk = text[pos:]
            pos += len(chunk)
            yield chunk, dict(event.get("meta_info") or {})

    def cache_prefix(self, prefix: str) -> None:
        self._request({"text": prefix, "sampling_params": {"max_new_tokens": 0}})

    def select(
        self,
        s: "StreamExecutor",
        choices: List[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        if temperature > 1e-5:
            raise ValueError("select scores choices by likelihood: temperature must be 0")
        prompt = s.text_
        # 1. Cache the shared prompt and learn its length in tokens.
        first = self._request({"text": prompt, "sampling_params": {"max_new_tokens": 0}})
        prompt_len = int(first["meta_info"]["prompt_tokens"])
        # 2. Score every continuation from two tokens before the prompt's end (token healing).
        scored = self._request(
            {
                "text": [prompt + c for c in choices],
                "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True,
                "return_text_in_logprobs": True,
                "logprob_start_len": max(prompt_len - 2, 0),
            }
        )
        if not isinstance(scored, list) or len(scored) != len(choices):
            raise BackendError(f"expected {len(choices)} results for select, got {scored!r}")
        input_lps: List[List[Any]] = []
        output_lps: List[List[Any]] = []
        normalized: List[float] = []
        for r in scored:
            entries = list(r["meta_info"]["input_token_logprobs"])
            norm = normalized_logprob(entries)
            entries, norm = heal_first_token(prompt, entries, norm)
            input_lps.append(entries)
            output_lps.append(list(r["meta_info"].get("output_token_logprobs") or []))
            normalized.append(norm)
        unconditional: Optional[List[List[Any]]] = None
        if choices_method.requires_unconditional_logprobs:
            ids = [[e[1] for e in entries] for entries in input_lps]
            unc = self._request(
                {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": 0},
                    "return_logprob": True,
                    "logprob_start_len": 0,
                }
            )
            unconditional = [list(r["meta_info"]["input_token_logprobs"]) for r in unc]
        return choices_method(
            choices=choices,
            normalized_prompt_logprobs=normalized,
            input_token_logprobs=input_lps,
            output_token_logprobs=output_lps,
            unconditional_token_logprobs=unconditional,
        )


def generate_result(obj: Any) -> Tuple[str, MetaInfo]:
    """The text and `meta_info` of a native `/generate` answer for one prompt."""
    if not isinstance(obj, dict) or "text" not in obj:
        raise BackendError(f"unexpected /generate response: {obj!r}")
    return str(obj["text"]), dict(obj.get("meta_info") or {})
