"""Errors cross the gRPC boundary as a code plus an ErrorDetail trailer; the gateway maps the reason,
never the English message. Both ends of the mapping, with the real proto and grpc types."""

from __future__ import annotations

import grpc
import pytest
from grpc.aio import Metadata

from common.gen import worker_pb2 as pb
from gateway.errors import ERROR_TRAILER, from_grpc
from gateway.serving import lost_worker_error
from worker.engine.errors import (
    AlreadyExistsError,
    ContextLengthError,
    EngineDeadError,
    EngineDrainingError,
    EngineOverloadedError,
    EngineStalledError,
    InvalidRequestError,
    NotEnabledError,
)
from worker.server.grpc_errors import ERROR_TRAILER as WORKER_TRAILER
from worker.server.grpc_errors import error_detail, reason_of, status_of


def worker_error(
    code: grpc.StatusCode, reason: str | None, param: str = "", details: str = "msg"
) -> grpc.aio.AioRpcError:
    trailer = Metadata()
    if reason is not None:
        trailer.add(ERROR_TRAILER, error_detail(reason, param).SerializeToString())
    return grpc.aio.AioRpcError(code, Metadata(), trailer, details)


def test_both_ends_name_the_same_trailer() -> None:
    assert ERROR_TRAILER == WORKER_TRAILER and ERROR_TRAILER.endswith("-bin")


@pytest.mark.parametrize(
    ("exc", "code", "reason"),
    [
        (InvalidRequestError("x", param="n"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER"),
        (ContextLengthError("x"), grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_LENGTH_EXCEEDED"),
        (AlreadyExistsError("x", "request_id"), grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS"),
        (NotEnabledError("x"), grpc.StatusCode.FAILED_PRECONDITION, "NOT_ENABLED"),
        (EngineOverloadedError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"),
        (EngineDeadError("x"), grpc.StatusCode.UNAVAILABLE, "ENGINE_DEAD"),
        (EngineStalledError("x"), grpc.StatusCode.UNAVAILABLE, "ENGINE_STALLED"),
        (EngineDrainingError("x"), grpc.StatusCode.UNAVAILABLE, "DRAINING"),
        (ValueError("x"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER"),
        (RuntimeError("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    ],
)
def test_worker_side(exc: Exception, code: grpc.StatusCode, reason: str) -> None:
    assert (status_of(exc), reason_of(exc)) == (code, reason)
    assert pb.ErrorReason.Name(error_detail(reason).reason) == f"ERROR_REASON_{reason}"


def test_context_length_is_named_by_reason_not_by_text() -> None:
    error = from_grpc(
        worker_error(grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_LENGTH_EXCEEDED", "prompt", "x"), "messages"
    )
    assert (error.status, error.param, error.code) == (400, "messages", "context_length_exceeded")
    # The old text match is gone: the words alone no longer make it a context-length error.
    plain = from_grpc(
        worker_error(grpc.StatusCode.INVALID_ARGUMENT, None, details="context length"), "messages"
    )
    assert plain.code is None


@pytest.mark.parametrize(
    ("code", "reason", "param", "status", "expected_param"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER", "stop_token_ids", 400, "stop_token_ids"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER", "prompt", 400, "messages"),
        (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", "model", 404, "model"),
        (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS", "lora_name", 400, "lora_name"),
        (grpc.StatusCode.FAILED_PRECONDITION, "NOT_ENABLED", "", 400, None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL", "", 503, None),
        (grpc.StatusCode.UNAVAILABLE, "DRAINING", "", 503, None),
        (grpc.StatusCode.UNAVAILABLE, None, "", 503, None),  # unreachable: no trailer
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, "", 504, None),  # the client's own deadline
        (grpc.StatusCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", "", 504, None),
        (grpc.StatusCode.INTERNAL, "INTERNAL", "", 500, None),
    ],
)
def test_gateway_side(code, reason, param, status, expected_param) -> None:
    error = from_grpc(worker_error(code, reason, param), "messages")
    assert (error.status, error.param) == (status, expected_param)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_a_garbled_trailer_counts_as_none() -> None:
    trailer = Metadata((ERROR_TRAILER, b"\xff\xff\xff"))
    error = from_grpc(
        grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, Metadata(), trailer, "bad"), "prompt"
    )
    assert (error.status, error.param) == (400, None)


def test_a_connection_failure_tells_the_client_what_happened_not_the_workers_address() -> None:
    """gRPC's own text for a refused or dropped connection names internal addresses; a client reads only
    what happened, the gateway's log keeps the text. A worker's own message (with its ErrorDetail) is kept."""
    text = "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.1.2.3:50051: Failed to connect"
    error = from_grpc(worker_error(grpc.StatusCode.UNAVAILABLE, None, details=text), "messages")
    assert error.status == 503 and "10.1.2.3" not in error.message and "connection" in error.message
    lost = lost_worker_error(worker_error(grpc.StatusCode.UNAVAILABLE, None, details=text))
    assert lost is not None and "10.1.2.3" not in lost.message
    own = worker_error(grpc.StatusCode.UNAVAILABLE, "DRAINING", "", "the worker is draining")
    draining = from_grpc(own, "messages")
    assert "the worker is draining" in draining.message
