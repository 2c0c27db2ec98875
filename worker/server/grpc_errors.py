"""The one place engine errors become gRPC statuses: a code plus a machine-readable reason.

The reason (protos/worker.proto's ErrorReason) and the parameter at fault travel as the binary
trailer `llmserve-error-bin`, a serialized ErrorDetail, so the gateway maps errors to the OpenAI
shape by reason and never by matching English text.
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from common.gen import worker_pb2
from worker.engine.errors import EngineError

ERROR_TRAILER = "llmserve-error-bin"

STATUS_BY_REASON: dict[str, grpc.StatusCode] = {
    "INVALID_PARAMETER": grpc.StatusCode.INVALID_ARGUMENT,
    "CONTEXT_LENGTH_EXCEEDED": grpc.StatusCode.INVALID_ARGUMENT,
    "MODEL_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "QUEUE_FULL": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "ENGINE_DEAD": grpc.StatusCode.UNAVAILABLE,
    "ENGINE_STALLED": grpc.StatusCode.UNAVAILABLE,
    "DRAINING": grpc.StatusCode.UNAVAILABLE,
    "DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,
    "INTERNAL": grpc.StatusCode.INTERNAL,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "NOT_ENABLED": grpc.StatusCode.FAILED_PRECONDITION,
}


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, EngineError):
        return exc.reason
    if isinstance(exc, ValueError):
        return "INVALID_PARAMETER"
    return "INTERNAL"


def status_of(exc: BaseException) -> grpc.StatusCode:
    return STATUS_BY_REASON[reason_of(exc)]


def error_detail(reason: str, param: str | None = None) -> worker_pb2.ErrorDetail:
    value = worker_pb2.ErrorReason.Value(f"ERROR_REASON_{reason}")
    return worker_pb2.ErrorDetail(reason=value, param=param or "")


def _trailer(reason: str, param: str | None) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_TRAILER, error_detail(reason, param).SerializeToString()),)


async def abort_with(
    context: grpc.aio.ServicerContext, reason: str, message: str, param: str | None = None
) -> NoReturn:
    """End the call with the reason's status code, the message and the ErrorDetail trailer."""
    await context.abort(STATUS_BY_REASON[reason], message, trailing_metadata=_trailer(reason, param))
    raise AssertionError("context.abort returned")  # it always raises


def end_with(context: grpc.aio.ServicerContext, reason: str, message: str, param: str | None = None) -> None:
    """Set what abort_with sends; the handler then returns. For Generate, which refuses prompts of up to
    megabytes: gRPC keeps an abort's exception in the call's state, and the frames of its traceback (the
    request, the context, the engine error it chained to) make a cycle with that state, so each refused
    prompt stayed in memory until a full garbage collection, rare in a process holding a model."""
    context.set_code(STATUS_BY_REASON[reason])
    context.set_details(message)
    context.set_trailing_metadata(_trailer(reason, param))


def end_for(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """end_with for an engine error."""
    end_with(context, reason_of(exc), str(exc) or type(exc).__name__, getattr(exc, "param", None))


async def abort_for(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """End the call for an engine error."""
    await abort_with(context, reason_of(exc), str(exc) or type(exc).__name__, getattr(exc, "param", None))
