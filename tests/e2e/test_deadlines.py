"""Deadlines and error reasons across the gRPC boundary, on real processes.

A client's gRPC deadline aborts the request in the worker and frees its KV blocks; the gateway's
GATEWAY_REQUEST_TIMEOUT_S is such a deadline, answered with a 504 (or an error event in a stream).
Worker errors carry a machine-readable reason (ErrorDetail trailer), not just English.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service, start_gateway
from tests.e2e.conftest import wait_for_idle

LONG = pb.SamplingParams(max_tokens=1500, ignore_eos=True, temperature=0.0)
ERROR_TRAILER = "llmserve-error-bin"


def reason_of(error: grpc.RpcError) -> tuple[str, str]:
    for key, value in error.trailing_metadata() or ():
        if key == ERROR_TRAILER:
            detail = pb.ErrorDetail.FromString(value)
            return pb.ErrorReason.Name(detail.reason), detail.param
    raise AssertionError(f"no {ERROR_TRAILER} trailer on {error.code()}: {error.details()}")


def test_a_passed_deadline_aborts_the_request_and_frees_its_blocks(
    worker_stub: worker_pb2_grpc.WorkerStub,
) -> None:
    request = pb.GenerateRequest(request_id="deadline-1", text="Tell me a long story.", params=LONG)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        for _ in worker_stub.Generate(request, timeout=1.0):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5.0
    stats = wait_for_idle(worker_stub)
    assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0)


@pytest.mark.parametrize(
    ("request_", "code", "reason", "param"),
    [
        (
            pb.GenerateRequest(text="x " * 3000, params=pb.SamplingParams(max_tokens=10)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_CONTEXT_LENGTH_EXCEEDED",
            "prompt",
        ),
        (
            pb.GenerateRequest(text="hi", model="another-model"),
            grpc.StatusCode.NOT_FOUND,
            "ERROR_REASON_MODEL_NOT_FOUND",
            "model",
        ),
        (
            pb.GenerateRequest(text="hi", params=pb.SamplingParams(stop_token_ids=[10**9], min_tokens=1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_INVALID_PARAMETER",
            "stop_token_ids",
        ),
        (
            pb.GenerateRequest(text="hi", params=pb.SamplingParams(temperature=float("inf"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_INVALID_PARAMETER",
            "temperature",
        ),
    ],
)
def test_errors_carry_a_reason(
    worker_stub: worker_pb2_grpc.WorkerStub,
    request_: pb.GenerateRequest,
    code,
    reason: str,
    param: str,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(worker_stub.Generate(request_, timeout=30))
    assert caught.value.code() == code
    assert reason_of(caught.value) == (reason, param)


@pytest.fixture(scope="module")
def impatient_gateway(worker: Service, log_dir) -> Iterator[Service]:
    service = start_gateway("gateway-timeout", log_dir, worker.addr, GATEWAY_REQUEST_TIMEOUT_S="1")
    yield service
    service.stop()


BODY = {"model": MODEL_NAME, "prompt": "Write a long story.", "max_tokens": 1500, "ignore_eos": True}


def test_gateway_timeout_is_a_504_and_frees_the_blocks(
    impatient_gateway: Service, worker_stub: worker_pb2_grpc.WorkerStub
) -> None:
    response = httpx.post(f"{impatient_gateway.addr}/v1/completions", json=BODY, timeout=30)
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("timeout_error", "request_timeout")
    assert wait_for_idle(worker_stub).num_kv_blocks_used == 0
