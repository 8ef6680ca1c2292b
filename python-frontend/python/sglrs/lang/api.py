"""The public language: `function`, `gen`, `select`, chat roles and the default backend.

These keep the names, arguments and defaults of SGLang's frontend, so a program written for
``import sglang as sgl`` runs unchanged under ``import sglrs as sgl``.
"""

from __future__ import annotations

import inspect
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Union, overload

from sglrs.lang.choices import ChoicesSamplingMethod, token_length_normalized
from sglrs.lang.interpreter import ProgramState, run_program, run_program_batch
from sglrs.lang.ir import (
    DType,
    SamplingParams,
    SglExpr,
    SglExprList,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    StopType,
    json_schema_string,
)

from sglrs.backend.base import BaseBackend


class _GlobalConfig:
    """Process-wide settings: the default backend."""

    def __init__(self) -> None:
        self.default_backend: Optional[BaseBackend] = None
        self.lock = threading.Lock()


global_config = _GlobalConfig()


def set_default_backend(backend: BaseBackend) -> None:
    """Use `backend` for every program run that does not name one."""
    global_config.default_backend = backend


def _backend_or_default(backend: Optional[BaseBackend]) -> BaseBackend:
    b = backend or global_config.default_backend
    if b is None:
        raise RuntimeError(
            "no backend: call sgl.set_default_backend(sgl.RuntimeEndpoint(url)) "
            "or pass backend=..."
        )
    return b


def flush_cache(backend: Optional[BaseBackend] = None) -> bool:
    """Empty the backend's prefix cache; `False` if there is no backend."""
    b = backend or global_config.default_backend
    if b is None:
        return False
    b.flush_cache()
    return True


def get_server_info(backend: Optional[BaseBackend] = None) -> Optional[Dict[str, Any]]:
    """The backend's server information, or `None` without a backend."""
    b = backend or global_config.default_backend
    if b is None:
        return None
    return b.get_server_info()


class SglFunction:
    """A program: a Python function whose first parameter is the state ``s``."""

    def __init__(
        self, func: Callable[..., Any], bind_arguments: Optional[Dict[str, Any]] = None
    ) -> None:
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].name != "s":
            raise TypeError('the first parameter of an sgl.function must be named "s"')
        self.func = func
        self.bind_arguments: Dict[str, Any] = dict(bind_arguments or {})
        self.arg_names = [p.name for p in params[1:]]
        self.arg_defaults = [p.default for p in params[1:] if p.default is not p.empty]
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", "sgl_function")

    def bind(self, **kwargs: Any) -> "SglFunction":
        """A copy with some arguments fixed."""
        unknown = [k for k in kwargs if k not in self.arg_names]
        if unknown:
            raise TypeError(f"unknown arguments {unknown} for {self.__name__}")
        return SglFunction(self.func, {**self.bind_arguments, **kwargs})

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        stop: Optional[StopType] = None,
        stop_token_ids: Optional[List[int]] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None,
        stream: bool = False,
        backend: Optional[BaseBackend] = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program once; the sampling arguments are defaults for every `gen`.

        Returns at once with the state; reading a variable or the text waits for it. With
        ``stream=True`` use ``state.text_iter()`` to read the output as it is generated.
        """
        defaults = SamplingParams.program_defaults(
            max_new_tokens=max_new_tokens,
            stop=stop,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
        return run_program(self, _backend_or_default(backend), args, kwargs, defaults, stream)

    def run_batch(
        self,
        batch_kwargs: Sequence[Union[Dict[str, Any], Sequence[Any]]],
        *,
        max_new_tokens: int = 128,
        stop: Optional[StopType] = None,
        stop_token_ids: Optional[List[int]] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None,
        backend: Optional[BaseBackend] = None,
        num_threads: Union[str, int] = "auto",
        progress_bar: bool = False,
    ) -> List[ProgramState]:
        """Run the program once per argument set, in parallel threads; states in input order.

        `batch_kwargs` items are dicts of arguments, or positional argument lists.
        """
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts")
        if not batch_kwargs:
            return []
        kw_list: List[Dict[str, Any]] = []
        n_required = len(self.arg_names) - len(self.arg_defaults)
        for item in batch_kwargs:
            if isinstance(item, dict):
                kw_list.append(dict(item))
            elif isinstance(item, (list, tuple)) and n_required <= len(item) <= len(
                self.arg_names
            ):
                kw_list.append({self.arg_names[i]: v for i, v in enumerate(item)})
            else:
                raise TypeError(f"arguments {item!r} do not match {self.__name__}'s signature")
        defaults = SamplingParams.program_defaults(
            max_new_tokens=max_new_tokens,
            stop=stop,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
        return run_program_batch(
            self, _backend_or_default(backend), kw_list, defaults, num_threads, progress_bar
        )

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


@overload
def function(func: Callable[..., Any]) -> SglFunction: ...


@overload
def function(
    func: None = None, num_api_spec_tokens: Optional[int] = None
) -> Callable[[Callable[..., Any]], SglFunction]: ...


def function(
    func: Optional[Callable[..., Any]] = None, num_api_spec_tokens: Optional[int] = None
) -> Union[SglFunction, Callable[[Callable[..., Any]], SglFunction]]:
    """Decorator: turn ``def prog(s, ...)`` into a program with `.run()` and `.run_batch()`.

    `num_api_spec_tokens` is accepted for SGLang compatibility (API speculative execution is
    for chat-only APIs; sglrs backends are completion backends and ignore it).
    """
    del num_api_spec_tokens
    if func is not None:
        return SglFunction(func)

    def decorator(f: Callable[..., Any]) -> SglFunction:
        return SglFunction(f)

    return decorator


def gen(
    name: Optional[str] = None,
    max_tokens: Optional[int] = None,
    min_tokens: Optional[int] = None,
    stop: Optional[StopType] = None,
    stop_token_ids: Optional[List[int]] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    ignore_eos: Optional[bool] = None,
    return_logprob: Optional[bool] = None,
    logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None,
    return_text_in_logprobs: Optional[bool] = None,
    dtype: Optional[DType] = None,
    choices: Optional[Sequence[str]] = None,
    choices_method: Optional[ChoicesSamplingMethod] = None,
    regex: Optional[str] = None,
    json_schema: Union[str, Dict[str, Any], None] = None,
) -> Union[SglGen, SglSelect]:
    """Generate text here and store it as variable `name`.

    With `choices`, this is `select`. `regex` and `json_schema` (a JSON string or a dict)
    constrain the output; `dtype` (int, float, str, bool) is a shorthand for a regex.
    Unset arguments take the program run's defaults.
    """
    if choices:
        return SglSelect(
            name,
            choices,
            0.0 if temperature is None else temperature,
            choices_method or token_length_normalized,
        )
    if regex is not None:
        re.compile(regex)  # a clear error before any request is sent
    params = SamplingParams(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=list(stop) if isinstance(stop, (list, tuple)) else stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        dtype=dtype,
        regex=regex,
        json_schema=json_schema_string(json_schema),
    )
    return SglGen(name, params)


def gen_int(name: Optional[str] = None, max_tokens: Optional[int] = None, **kwargs: Any) -> SglGen:
    """`gen` constrained to an integer."""
    out = gen(name, max_tokens, dtype=int, **kwargs)
    assert isinstance(out, SglGen)
    return out


def gen_string(
    name: Optional[str] = None, max_tokens: Optional[int] = None, **kwargs: Any
) -> SglGen:
    """`gen` constrained to a double-quoted string."""
    out = gen(name, max_tokens, dtype=str, **kwargs)
    assert isinstance(out, SglGen)
    return out


def select(
    name: Optional[str] = None,
    choices: Optional[Sequence[str]] = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> SglSelect:
    """Append the most likely of `choices` (by mean token logprob) and store it as `name`."""
    if choices is None:
        raise ValueError("select needs choices")
    return SglSelect(name, choices, temperature, choices_method)


def _role(name: str, expr: Union[SglExpr, str, None]) -> SglExprList:
    if expr is None:
        return SglExprList([SglRoleBegin(name), SglRoleEnd(name)])
    body = expr if isinstance(expr, SglExpr) else SglExprList([]) + expr
    return SglExprList([SglRoleBegin(name), body, SglRoleEnd(name)])


def system(expr: Union[SglExpr, str, None] = None) -> SglExprList:
    """A system message around `expr`, in the model's chat template."""
    return _role("system", expr)


def user(expr: Union[SglExpr, str, None] = None) -> SglExprList:
    """A user message around `expr`."""
    return _role("user", expr)


def assistant(expr: Union[SglExpr, str, None] = None) -> SglExprList:
    """An assistant message around `expr` (typically a `gen`)."""
    return _role("assistant", expr)


def system_begin() -> SglRoleBegin:
    """Open a system message."""
    return SglRoleBegin("system")


def system_end() -> SglRoleEnd:
    """Close the system message."""
    return SglRoleEnd("system")


def user_begin() -> SglRoleBegin:
    """Open a user message."""
    return SglRoleBegin("user")


def user_end() -> SglRoleEnd:
    """Close the user message."""
    return SglRoleEnd("user")


def assistant_begin() -> SglRoleBegin:
    """Open an assistant message."""
    return SglRoleBegin("assistant")


def assistant_end() -> SglRoleEnd:
    """Close the assistant message."""
    return SglRoleEnd("assistant")
