"""How `select` turns per-token logprobs of each choice into a decision.

A backend scores every choice by the logprobs of its tokens given the prompt (see
`sglrs.backend.base.GenerateApiBackend.select`); a sampling method picks one. The default,
`token_length_normalized`, takes the choice with the highest mean token logprob, as SGLang's
frontend does.

Logprob entries are ``[logprob, token_id, text_or_None]`` lists, as in SGLang's native API.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence

LogprobEntry = Sequence[Any]


@dataclasses.dataclass
class ChoicesDecision:
    """The chosen string and the scores it was chosen by."""

    decision: str
    meta_info: Optional[Dict[str, Any]] = None


def argmax_first(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (NaN never wins)."""
    if not values:
        raise ValueError("argmax of an empty sequence")
    best = 0
    for i, v in enumerate(values):
        if math.isnan(values[best]) or (not math.isnan(v) and v > values[best]):
            best = i
    return best


def normalized_logprob(entries: Sequence[LogprobEntry]) -> float:
    """Mean of the logprobs in `entries`, skipping missing (`None`) and zero values.

    This is SGLang's `compute_normalized_prompt_logprobs`: the first prompt token has no
    logprob (`None`), and SGLang's filter also drops exact zeros. Returns `-inf` when no value
    remains, so such a choice never wins over a scored one.
    """
    values = [float(e[0]) for e in entries if e[0]]
    if not values:
        return -math.inf
    return sum(values) / len(values)


def heal_first_token(
    prompt: str, entries: List[LogprobEntry], normalized: float
) -> "tuple[List[LogprobEntry], float]":
    """Drop the first scored token when it still belongs to the prompt.

    Scoring starts two tokens before the end of the prompt (``logprob_start_len =
    prompt_tokens - 2``) so that a choice which re-tokenises the prompt's last token ("token
    healing") is scored fairly. When the first scored token's text is a suffix of the prompt,
    no healing happened and it is removed from the mean, exactly as SGLang does.
    """
    if len(entries) < 2:
        return entries, normalized
    first = entries[0]
    text = first[2] if len(first) > 2 else None
    if text is not None and prompt.endswith(text):
        first_lp = float(first[0]) if first[0] is not None else 0.0
        n = len(entries)
        normalized = (normalized * n - first_lp) / (n - 1)
        entries = entries[1:]
    return entries, normalized


class ChoicesSamplingMethod(abc.ABC):
    """A rule that picks one choice from its scores."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        """Whether the backend must also score each choice without the prompt."""
        return False

    @abc.abstractmethod
    def __call__(
        self,
        *,
        choices: List[str],
        normalized_prompt_logprobs: List[float],
        input_token_logprobs: List[List[LogprobEntry]],
        output_token_logprobs: List[List[LogprobEntry]],
        unconditional_token_logprobs: Optional[List[List[LogprobEntry]]] = None,
    ) -> ChoicesDecision:
        """Pick one of `choices`."""


class TokenLengthNormalized(ChoicesSamplingMethod):
    """Highest mean token logprob (SGLang's default)."""

    def __call__(
        self,
        *,
        choices: List[str],
        normalized_prompt_logprobs: List[float],
        input_token_logprobs: List[List[LogprobEntry]],
        output_token_logprobs: List[List[LogprobEntry]],
        unconditional_token_logprobs: Optional[List[List[LogprobEntry]]] = None,
    ) -> ChoicesDecision:
        best = argmax_first(normalized_prompt_logprobs)
        return ChoicesDecision(
            decision=choices[best],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
            },
        )


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those with the best logprob at each position.

    A shorter choice is padded with its own mean logprob.
    """

    def __call__(
        self,
        *,
        choices: List[str],
        normalized_prompt_logprobs: List[float],
        input_token_logprobs: List[List[LogprobEntry]],
        output_token_logprobs: List[List[LogprobEntry]],
        unconditional_token_logprobs: Optional[List[List[LogprobEntry]]] = None,
    ) -> ChoicesDecision:
        width = max((len(o) for o in input_token_logprobs), default=0)
        matrix: List[List[float]] = []
        for option in input_token_logprobs:
            row = [float(t[0]) if t[0] is not None else 0.0 for t in option]
            mean = sum(row) / len(row) if row else float("nan")
            matrix.append(row + [mean] * (width - len(row)))
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(
            decision=choices[remaining[0]],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "greedy_logprob_matrix": matrix,
            },
        )


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Highest mean of (logprob given the prompt − logprob without it) per token."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: List[str],
        normalized_prompt_logprobs: List[float],
        input_token_logprobs: List[List[LogprobEntry]],
        output_token_logprobs: List[List[LogprobEntry]],
        unconditional_token_logprobs: Optional[List[List[LogprobEntry]]] = None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional token logprobs are required for this method")
        scores: List[float] = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs differ in length")
            diffs = [
                float(c[0] or 0.0) - float(u[0] or 0.0)
                for c, u in zip(cond, uncond)
            ]
            scores.append(sum(diffs) / len(diffs) if diffs else -math.inf)
        best = argmax_first(scores)
        return ChoicesDecision(
            decision=choices[best],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "unconditional_token_logprobs": unconditional_token_logprobs,
                "normalized_unconditional_prompt_logprobs": scores,
            },
        )


#: The default `select` method.
token_length_normalized = TokenLengthNormalized()
#: Token-by-token greedy comparison.
greedy_token_selection = GreedyTokenSelection()
#: Likelihood normalised by the choice's unconditional likelihood.
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
