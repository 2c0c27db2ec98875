"""The sampling contract (common/sampling.py) against what derives from it: the proto names the same fields,
the worker's dataclass has its defaults, the gateway's models its bounds, and the checks refuse by it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from common import sampling
from common.gen import worker_pb2 as pb
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from worker.engine.sampling_params import SamplingParams

# The HTTP fields that feed a contract field under another name.
HTTP_ALIASES = {"max_completion_tokens": "max_tokens", "top_logprobs": "logprobs"}


def test_the_proto_and_the_contract_name_the_same_fields() -> None:
    proto_fields = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}
    assert proto_fields == set(sampling.NAMES)


def test_every_number_is_optional_on_the_wire() -> None:
    """Unset must be told from zero, or the worker could not apply the contract's default."""
    by_name = pb.SamplingParams.DESCRIPTOR.fields_by_name
    for name in sampling.NUMBER_FIELDS:
        assert by_name[name].has_presence, name


def test_the_engine_dataclass_has_every_field_with_the_contract_default() -> None:
    params = SamplingParams()
    engine_fields = {f.name for f in dataclasses.fields(SamplingParams)}
    assert engine_fields == set(sampling.NAMES)
    for field in sampling.FIELDS:
        value = getattr(params, field.name)
        assert value == field.default or (not value and not field.default), field.name


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_the_gateway_models_take_the_contract_bounds(model: type) -> None:
    properties = model.model_json_schema()["properties"]
    checked = 0
    for http_name, schema in properties.items():
        name = HTTP_ALIASES.get(http_name, http_name)
        if name not in sampling.NUMBER_FIELDS or http_name == "logprobs" and model is ChatCompletionRequest:
            continue
        number = next(s for s in schema["anyOf"] if s["type"] in ("integer", "number"))
        bounds = sampling.bounds(name)
        low_key = "exclusiveMinimum" if bounds.low_open else "minimum"
        assert (number[low_key], number["maximum"]) == (bounds.low, bounds.high), http_name
        checked += 1
    assert checked >= len(sampling.NUMBER_FIELDS) - 1  # chat has no prompt_logprobs


@pytest.mark.parametrize("name", sampling.NUMBER_FIELDS)
def test_each_number_is_refused_just_outside_its_bounds(name: str) -> None:
    bounds = sampling.bounds(name)
    step = 1 if sampling.BY_NAME[name].type is int else 0.01
    sampling.check({name: bounds.high})
    sampling.check({name: bounds.low + (step if bounds.low_open else 0), "prompt_logprobs": 0})
    for outside in (bounds.high + step, bounds.low if bounds.low_open else bounds.low - step):
        with pytest.raises(sampling.SamplingError) as info:
            sampling.check({name: outside})
        assert info.value.param == name


def test_non_finite_numbers_and_cross_field_rules() -> None:
    for values, param in [
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": math.inf}, "top_p"),
        ({"logit_bias": {3: 100.5}}, "logit_bias"),
        ({"logit_bias": {3: math.nan}}, "logit_bias"),
        ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ({"max_tokens": 0}, "max_tokens"),  # 0 scores a prompt: only with prompt logprobs
        ({"stop": ["a", ""]}, "stop"),
        ({"stop": ["a"] * (sampling.MAX_STOP_STRINGS + 1)}, "stop"),
        ({"stop_token_ids": [1] * (sampling.MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids"),
    ]:
        with pytest.raises(sampling.SamplingError) as info:
            sampling.check(values)
        assert info.value.param == param, values
    sampling.check({"max_tokens": 3, "min_tokens": 3, "logit_bias": {3: -100.0}, "stop": ["a"]})
    sampling.check({"max_tokens": 0, "prompt_logprobs": 0})
