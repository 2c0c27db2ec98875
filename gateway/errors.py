"""One exception type for every client-visible failure, rendered in the OpenAI error shape."""

from __future__ import annotations

import logging
from typing import Any

import grpc
from fastapi.responses import JSONResponse

from common.gen import worker_pb2

log = logging.getLogger(__name__)

RETRY_AFTER_S = "1"
ERROR_TRAILER = "llmserve-error-bin"  # the worker's ErrorDetail (worker/server/grpc_errors.py)


class APIError(Exception):
    """A failure with its HTTP status and OpenAI error fields; `headers` go on the response."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(model: str, served: str) -> APIError:
    message = f"The model `{model}` does not exist. This gateway serves `{served}`."
    return APIError(404, message, "invalid_request_error", "model", "model_not_found")


def unavailable(message: str) -> APIError:
    """503 with Retry-After: the worker is down or its queue is full; the client may retry."""
    headers = {"Retry-After": RETRY_AFTER_S}
    return APIError(503, message, "service_unavailable", None, "service_unavailable", headers)


def worker_lost(detail: str) -> APIError:
    """503: the worker running the request went away before it finished; the client may retry."""
    return unavailable(f"The worker running the request went away before it finished ({detail}); retry it")


def timed_out(message: str) -> APIError:
    """504: the request ran past its deadline (GATEWAY_REQUEST_TIMEOUT_S) and was aborted."""
    return APIError(504, message, "timeout_error", None, "request_timeout")


def error_detail(error: grpc.aio.AioRpcError) -> worker_pb2.ErrorDetail | None:
    """The worker's machine-readable reason, when the status came from the worker (not from gRPC)."""
    for key, value in error.trailing_metadata() or ():
        if key == ERROR_TRAILER and isinstance(value, bytes):
            detail = worker_pb2.ErrorDetail()
            try:
                detail.ParseFromString(value)
            except Exception:  # a garbled trailer is treated as absent
                return None
            return detail
    return None


# The request as given cannot succeed here: a bad parameter, a request id or adapter name in use, a feature
# the worker was not started with (LoRA). OpenAI and vLLM answer each with 400.
_INVALID_REQUEST_CODES = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION}
)


def client_details(error: grpc.aio.AioRpcError) -> str:
    """What of a worker call's status text a client may read: the worker's own message (it comes with an
    ErrorDetail and is written for users); for a status gRPC made itself (a connection refused or dropped),
    only what happened: its text names internal addresses (`ipv4:10.0.0.7:50051: Failed to connect`), which
    go to the gateway's log instead."""
    if error_detail(error) is not None:
        return error.details() or error.code().name
    log.warning("worker call failed: %s: %s", error.code().name, error.details())
    return (
        "the connection to the worker failed"
        if error.code() == grpc.StatusCode.UNAVAILABLE
        else error.code().name
    )


def from_grpc(error: grpc.aio.AioRpcError, prompt_param: str) -> APIError:
    """Map a worker status to an HTTP error by its reason (the code alone when there is none, as when
    the worker could not be reached); the worker's message is already written for users."""
    code = error.code()
    message = error.details() or code.name
    detail = error_detail(error)
    reason = worker_pb2.ErrorReason.Name(detail.reason).removeprefix("ERROR_REASON_") if detail else ""
    param = (prompt_param if detail.param == "prompt" else detail.param or None) if detail else None
    if reason == "CONTEXT_LENGTH_EXCEEDED":
        return invalid_request(message, prompt_param, "context_length_exceeded")
    if code in _INVALID_REQUEST_CODES:
        return invalid_request(message, param)
    if code == grpc.StatusCode.NOT_FOUND:
        return APIError(404, message, "invalid_request_error", "model", "model_not_found")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return unavailable(f"The worker is overloaded: {message}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return timed_out(f"The request timed out and was aborted: {message}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return unavailable(f"No worker is available: {client_details(error)}")
    return APIError(500, f"The worker failed: {message}", "server_error", None, "worker_error")
