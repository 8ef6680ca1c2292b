"""The expressions a program appends to its state, and the sampling parameters of `gen`.

A program is ordinary Python: each ``s += expr`` hands one expression to the state's executor,
which runs them in order on a worker thread. The expression types here are plain data; the
interpreter (`sglrs.lang.interpreter`) gives them meaning.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

if TYPE_CHECKING:
    from sglrs.lang.choices import ChoicesSamplingMethod
    from sglrs.lang.interpreter import ProgramState

#: Regex for `dtype=int` (the stop strings `" "` and `"\\n"` end it), as SGLang defines it.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
#: Regex for `dtype=float`.
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
#: Regex for `dtype=bool`.
REGEX_BOOL = r"(True|False)"
#: Regex for `dtype=str`: a double-quoted run of word characters and spaces.
REGEX_STR = r"\"[\w\d\s]*\""

StopType = Union[str, List[str]]
DType = Union[type, str]


@dataclasses.dataclass
class SamplingParams:
    """Sampling parameters of one `gen` call; `None` means "inherit the program default".

    Field names follow SGLang's frontend (`max_new_tokens`, `stop`, ...); `to_srt_kwargs`
    turns them into the `sampling_params` object of SGLang's native `/generate` API.
    """

    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    stop: Optional[StopType] = None
    stop_token_ids: Optional[List[int]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    dtype: Optional[DType] = None
    regex: Optional[str] = None
    json_schema: Optional[str] = None

    @staticmethod
    def program_defaults(
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
    ) -> "SamplingParams":
        """The defaults a program run starts from (SGLang's: 128 tokens, temperature 1)."""
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            stop=list(stop) if isinstance(stop, (list, tuple)) else stop,
            stop_token_ids=list(stop_token_ids or []),
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

    def merged(self, override: "SamplingParams") -> "SamplingParams":
        """A copy of `self` with every non-`None` field of `override` taking precedence."""
        out = dataclasses.replace(self)
        for field in dataclasses.fields(SamplingParams):
            value = getattr(override, field.name)
            if value is not None:
                setattr(out, field.name, list(value) if isinstance(value, list) else value)
        if isinstance(out.stop, list):
            out.stop = list(out.stop)
        return out

    def stop_list(self) -> List[str]:
        """`stop` as a list (a string becomes a one-element list, `None` an empty one)."""
        if self.stop is None:
            return []
        if isinstance(self.stop, str):
            return [self.stop] if self.stop else []
        return list(self.stop)

    def apply_dtype(self) -> None:
        """Turn `dtype` into the regex (and stop strings) SGLang's frontend uses for it."""
        if self.dtype is None:
            return
        stop = self.stop_list()
        if self.dtype in ("int", int):
            regex = REGEX_INT
            stop.extend([" ", "\n"])
        elif self.dtype in ("float", float):
            regex = REGEX_FLOAT
            stop.extend([" ", "\n"])
        elif self.dtype in ("str", str):
            regex = REGEX_STR
        elif self.dtype in ("bool", bool):
            regex = REGEX_BOOL
        else:
            raise ValueError(f"invalid dtype {self.dtype!r}: use int, float, str or bool")
        self.stop = stop
        self.regex = regex

    def to_srt_kwargs(self) -> Dict[str, Any]:
        """The `sampling_params` object of a native `/generate` request.

        Only fields that are set are sent, so a server's own defaults apply to the rest.
        """
        out: Dict[str, Any] = {}
        for name in (
            "max_new_tokens",
            "min_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "ignore_eos",
            "regex",
            "json_schema",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        stop = self.stop_list()
        if stop:
            out["stop"] = stop
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        return out

    def logprob_kwargs(self) -> Dict[str, Any]:
        """The top-level logprob fields of a native `/generate` request that are set."""
        out: Dict[str, Any] = {}
        for name in (
            "return_logprob",
            "logprob_start_len",
            "top_logprobs_num",
            "return_text_in_logprobs",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


class SglExpr:
    """Base of every expression a program can append to its state (`s += expr`).

    Expressions concatenate with `+` (and with strings) into an `SglExprList`.
    """

    def __add__(self, other: Union["SglExpr", str]) -> "SglExprList":
        return SglExprList.concat(self, _as_expr(other))

    def __radd__(self, other: Union["SglExpr", str]) -> "SglExprList":
        return SglExprList.concat(_as_expr(other), self)


def _as_expr(value: Union[SglExpr, str]) -> SglExpr:
    if isinstance(value, SglExpr):
        return value
    if isinstance(value, str):
        return SglConstantText(value)
    raise TypeError(f"cannot append {type(value).__name__} to a program state")


class SglExprList(SglExpr):
    """A sequence of expressions run in order."""

    def __init__(self, expr_list: Sequence[SglExpr]) -> None:
        self.expr_list: List[SglExpr] = list(expr_list)

    @staticmethod
    def concat(a: SglExpr, b: SglExpr) -> "SglExprList":
        """Flatten `a + b` into one list."""
        left = a.expr_list if isinstance(a, SglExprList) else [a]
        right = b.expr_list if isinstance(b, SglExprList) else [b]
        return SglExprList(left + right)

    def __repr__(self) -> str:
        return f"ExprList({self.expr_list!r})"


class SglConstantText(SglExpr):
    """Literal text appended to the prompt."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class SglGen(SglExpr):
    """Generate text from the model at this point and store it under `name`."""

    def __init__(self, name: Optional[str], sampling_params: SamplingParams) -> None:
        self.name = name
        self.sampling_params = sampling_params

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class SglSelect(SglExpr):
    """Pick one of `choices` by the model's (normalised) likelihood and store it under `name`."""

    def __init__(
        self,
        name: Optional[str],
        choices: Sequence[str],
        temperature: float,
        choices_method: "ChoicesSamplingMethod",
    ) -> None:
        if not choices:
            raise ValueError("select needs at least one choice")
        for c in choices:
            if not isinstance(c, str):
                raise TypeError(f"select choices must be strings, got {type(c).__name__}")
        self.name = name
        self.choices = list(choices)
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices!r})"


class SglRoleBegin(SglExpr):
    """Open a chat message of `role` (writes the chat template's prefix for it)."""

    def __init__(self, role: str) -> None:
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role})"


class SglRoleEnd(SglExpr):
    """Close the open chat message of `role` (writes the template's suffix)."""

    def __init__(self, role: str) -> None:
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role})"


class SglVarScopeBegin(SglExpr):
    """Start capturing the text appended from here into the variable `name`."""

    def __init__(self, name: str) -> None:
        self.name = name


class SglVarScopeEnd(SglExpr):
    """Stop capturing text into the variable `name`."""

    def __init__(self, name: str) -> None:
        self.name = name


class SglCommitLazy(SglExpr):
    """Ask the backend to compute (and cache) the prompt so far, e.g. before a fork."""


class SglVariable(SglExpr):
    """Append the value of variable `name` of another program state (waits for it)."""

    def __init__(self, name: str, source: "ProgramState") -> None:
        self.name = name
        self.source = source


def json_schema_string(schema: Union[str, Dict[str, Any], None]) -> Optional[str]:
    """A JSON Schema as the JSON string the native API expects (dicts are serialised)."""
    if schema is None or isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    raise TypeError("json_schema must be a JSON string or a dict")
