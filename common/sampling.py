"""The sampling contract: each field of the wire's SamplingParams (protos/worker.proto) with its type,
default and accepted range, written once.

The gateway's request models take their bounds from here, its cache fingerprint its defaults, its proto
conversion and the worker's checks their field lists and ranges; so a body is refused alike over HTTP and
over gRPC, naming the same parameter. The proto stays the wire definition; a test
(tests/unit/test_sampling_contract.py) checks that both name the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 128  # choices per request: each one is a sequence of its own in the engine
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0
# Each stop string is matched against the text after every token: bounds for direct gRPC clients (the
# gateway's own limits, GATEWAY_MAX_STOP and GATEWAY_MAX_STOP_CHARS, are tighter).
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_ALLOWED_TOKEN_IDS = 1 << 17  # past any vocabulary this stack serves
MAX_BAD_WORDS = 64  # each is matched against the output's tail before every token
MAX_BAD_WORD_CHARS = 256
GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


class SamplingError(ValueError):
    """A value outside the contract; `param` names the field, as the OpenAI error's `param` does."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Bounds:
    low: float
    high: float
    low_open: bool = False  # (low, high] rather than [low, high]

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def pydantic(self) -> dict[str, float]:
        """The same bounds as pydantic Field arguments."""
        return {"gt" if self.low_open else "ge": self.low, "le": self.high}


@dataclass(frozen=True)
class SamplingField:
    name: str
    type: type  # float, int, bool, list (stop, stop_token_ids), dict (logit_bias), object (structured output)
    default: Any  # what the engine uses when the field is unset
    bounds: Bounds | None = None  # numbers: the value's; stop_token_ids: each id's; logit_bias: each bias'
    note: str = ""


def _number(
    name: str, kind: type, default: Any, low: float, high: float, open_: bool = False, note: str = ""
) -> SamplingField:
    return SamplingField(name, kind, default, Bounds(low, high, open_), note)


FIELDS: tuple[SamplingField, ...] = (
    _number("n", int, 1, 1, MAX_N, note="choices"),
    _number("temperature", float, 1.0, 0.0, 2.0, note="0: greedy"),
    _number("top_p", float, 1.0, 0.0, 1.0, open_=True),
    _number("top_k", int, 0, -1, INT32_MAX, note="-1 or 0: off (vLLM's -1)"),
    _number("min_p", float, 0.0, 0.0, 1.0),
    _number("seed", int, None, INT64_MIN, INT64_MAX, note="unset: not reproducible"),
    _number("presence_penalty", float, 0.0, -2.0, 2.0),
    _number("frequency_penalty", float, 0.0, -2.0, 2.0),
    _number("repetition_penalty", float, 1.0, 0.0, 10.0, open_=True, note="vLLM's; 1: off"),
    _number("max_tokens", int, None, 0, INT32_MAX, note="unset: up to the context; 0: score the prompt only"),
    _number("min_tokens", int, 0, 0, INT32_MAX),
    _number("logprobs", int, None, 0, MAX_TOP_LOGPROBS, note="unset: none; k: the sampled token's and top k"),
    _number("prompt_logprobs", int, None, 0, MAX_TOP_LOGPROBS, note="unset: none; k: each prompt token's"),
    SamplingField("ignore_eos", bool, False),
    SamplingField("skip_special_tokens", bool, True, note="vLLM's; false: special tokens are in the text"),
    SamplingField("include_stop_str_in_output", bool, False, note="vLLM's; true: the stop in the text"),
    SamplingField("stop", list, (), note=f"at most {MAX_STOP_STRINGS}, each 1..{MAX_STOP_CHARS} characters"),
    SamplingField("stop_token_ids", list, (), Bounds(0, INT32_MAX), note=f"at most {MAX_STOP_TOKEN_IDS}"),
    SamplingField("logit_bias", dict, {}, Bounds(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS), note="token id -> bias"),
    SamplingField("allowed_token_ids", list, (), Bounds(0, INT32_MAX), note="vLLM's; empty: every token"),
    SamplingField("bad_words", list, (), note=f"vLLM's; at most {MAX_BAD_WORDS}"),
    SamplingField("structured_output", object, None, note=f"unset: free text; else one of {GRAMMAR_KINDS}"),
)
BY_NAME: dict[str, SamplingField] = {f.name: f for f in FIELDS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
DEFAULTS: dict[str, Any] = {f.name: f.default for f in FIELDS}
# The numbers: `optional` on the wire (unset means the default), each with its bounds.
NUMBER_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.type in (int, float))
FLOAT_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.type is float)


def bounds(name: str) -> Bounds:
    found = BY_NAME[name].bounds
    assert found is not None, name
    return found


def check_number(name: str, value: float, param: str | None = None) -> None:
    """Raise SamplingError unless `value` is finite and within `name`'s bounds (`param`: the client's
    name for the field, where it differs)."""
    param = param or name
    if isinstance(value, float) and not math.isfinite(value):
        raise SamplingError(f"{param} must be a finite number", param)
    if value not in bounds(name):
        raise SamplingError(f"{param} must be in {bounds(name)}, got {value}", param)


def check(values: Mapping[str, Any]) -> None:
    """Every contract field present in `values` (None: unset), then the rules that tie fields together."""
    for name in NUMBER_FIELDS:
        if values.get(name) is not None:
            check_number(name, values[name])
    _check_stop(list(values.get("stop") or ()))
    stop_token_ids = list(values.get("stop_token_ids") or ())
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise SamplingError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed", "stop_token_ids")
    if len(values.get("allowed_token_ids") or ()) > MAX_ALLOWED_TOKEN_IDS:
        raise SamplingError(f"at most {MAX_ALLOWED_TOKEN_IDS} allowed token ids", "allowed_token_ids")
    bad_words = list(values.get("bad_words") or ())
    if len(bad_words) > MAX_BAD_WORDS or not all(0 < len(w) <= MAX_BAD_WORD_CHARS for w in bad_words):
        message = f"at most {MAX_BAD_WORDS} bad words, each of 1 to {MAX_BAD_WORD_CHARS} characters"
        raise SamplingError(message, "bad_words")
    for bias in (values.get("logit_bias") or {}).values():
        if not (math.isfinite(bias) and bias in bounds("logit_bias")):
            message = f"logit_bias values must be in {bounds('logit_bias')}, got {bias}"
            raise SamplingError(message, "logit_bias")
    max_tokens, min_tokens = values.get("max_tokens"), values.get("min_tokens")
    if max_tokens == 0 and values.get("prompt_logprobs") is None:  # a run that would return nothing at all
        raise SamplingError(
            "max_tokens must be at least 1 unless prompt logprobs are asked for", "max_tokens"
        )
    if max_tokens is not None and min_tokens is not None and min_tokens > max_tokens:
        raise SamplingError("min_tokens must not exceed max_tokens", "min_tokens")


def _check_stop(stop: list[str]) -> None:
    if not all(stop):
        raise SamplingError("stop strings must not be empty", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise SamplingError(f"at most {MAX_STOP_STRINGS} stop strings are allowed", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise SamplingError(f"each stop string may have at most {MAX_STOP_CHARS} characters", "stop")
