"""One exception type for every client-visible failure, rendered in the OpenAI error shape."""

from __future__ import annotations

from typing import Any

import grpc
from fastapi.responses import JSONResponse

RETRY_AFTER_S = "1"


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


def from_grpc(error: grpc.aio.AioRpcError, prompt_param: str) -> APIError:
    """Map a worker status to an HTTP error; the worker's message is already written for users."""
    code = error.code()
    message = error.details() or code.name
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if "context length" in message:
            return invalid_request(message, prompt_param, "context_length_exceeded")
        return invalid_request(message)
    if code == grpc.StatusCode.NOT_FOUND:
        return APIError(404, message, "invalid_request_error", "model", "model_not_found")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return unavailable(f"The worker is overloaded: {message}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return unavailable(f"No worker is available: {message}")
    return APIError(500, f"The worker failed: {message}", "server_error", None, "worker_error")
