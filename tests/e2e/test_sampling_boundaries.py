"""Every boundary of the sampling contract (common/sampling.py), sent to the gateway over HTTP and to the
worker over gRPC: each value is accepted both ways or refused both ways, naming the same parameter."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest

from common import sampling
from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME

ERROR_TRAILER = "llmserve-error-bin"
INT32_MAX = sampling.INT32_MAX


def boundary_cases() -> list[tuple[str, Any]]:
    """Each number at its bounds and one step outside them, where the wire can carry the value."""
    cases: list[tuple[str, Any]] = []
    for name in sampling.NUMBER_FIELDS:
        bounds = sampling.bounds(name)
        is_int = sampling.BY_NAME[name].type is int
        step = 1 if is_int else 0.01
        low_inside = bounds.low + step if bounds.low_open else bounds.low
        low_outside = bounds.low if bounds.low_open else bounds.low - step
        values = [low_inside, low_outside, bounds.high, bounds.high + step]
        if name == "seed":
            values = [bounds.low, bounds.high]  # one past them is not an int64 on the wire
        elif is_int and bounds.high == INT32_MAX:
            values = values[:3]  # nor one past an int32
        if name == "max_tokens":
            values = values[:2]  # the top is refused by the context length, not the contract
        if name == "n":
            values.remove(bounds.high)  # 128 choices take half a minute here; tests/unit admits them
        cases += [(name, int(v) if is_int else float(v)) for v in values]
    return cases + [("logit_bias", 100.0), ("logit_bias", 100.5), ("logit_bias", -100.5)]


def http_outcome(http: httpx.Client, name: str, value: Any) -> str | None:
    """None when served, else the refused parameter."""
    body: dict[str, Any] = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
    body.update({"logit_bias": {"5": value}} if name == "logit_bias" else {name: value})
    response = http.post("/v1/completions", json=body)
    if response.status_code == 200:
        return None
    assert response.status_code == 400, response.text
    return response.json()["error"]["param"]


def grpc_outcome(stub: worker_pb2_grpc.WorkerStub, name: str, value: Any) -> str | None:
    params = pb.SamplingParams(max_tokens=1)
    if name == "logit_bias":
        params.logit_bias[5] = value
    else:
        setattr(params, name, value)
    try:
        list(stub.Generate(pb.GenerateRequest(text="Hi", params=params), timeout=60))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        trailer = dict(exc.trailing_metadata() or ())[ERROR_TRAILER]
        return pb.ErrorDetail.FromString(trailer).param
    return None


@pytest.mark.parametrize(("name", "value"), boundary_cases(), ids=lambda v: str(v))
def test_http_and_grpc_refuse_alike(
    http: httpx.Client, worker_stub: worker_pb2_grpc.WorkerStub, name: str, value: Any
) -> None:
    over_http = http_outcome(http, name, value)
    over_grpc = grpc_outcome(worker_stub, name, value)
    assert over_http == over_grpc, (over_http, over_grpc)
    # min_tokens above max_tokens (1 here) and max_tokens 0 without prompt logprobs break cross-field rules
    crossed = (name == "min_tokens" and value > 1) or (name == "max_tokens" and value == 0)
    inside = value in sampling.bounds(name) and not crossed
    assert (over_http is None) == inside, over_http
