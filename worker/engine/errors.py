"""Engine errors, each with one meaning for every transport.

Each class names its machine-readable reason (protos/worker.proto's ErrorReason, without the
ERROR_REASON_ prefix); worker/server/servicer.py turns the class into a gRPC status plus that reason, and the
gateway turns the reason into the OpenAI error. `param` names the request parameter at fault, in
the OpenAI API's words, where it is known.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class."""

    reason = "INTERNAL"

    def __init__(self, message: str = "", param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidRequestError(EngineError, ValueError):
    """The request can never be served as given (bad parameters, prompt too long)."""

    reason = "INVALID_PARAMETER"


class AlreadyExistsError(InvalidRequestError):
    """A request id or adapter name that is in use already: the request is fine, its name is not."""

    reason = "ALREADY_EXISTS"


class NotEnabledError(InvalidRequestError):
    """A feature this worker was not started with: the same request succeeds on a worker that has it."""

    reason = "NOT_ENABLED"


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_tokens exceed the model's context (or the whole KV cache)."""

    reason = "CONTEXT_LENGTH_EXCEEDED"

    def __init__(self, message: str = "", param: str | None = "prompt") -> None:
        super().__init__(message, param)


class EngineOverloadedError(EngineError):
    """The waiting queue is full; retry later."""

    reason = "QUEUE_FULL"


class EngineDeadError(EngineError):
    """The engine loop has stopped; no request can be served."""

    reason = "ENGINE_DEAD"


class EngineStalledError(EngineError):
    """The engine loop has made no progress for longer than the stall timeout; retry elsewhere."""

    reason = "ENGINE_STALLED"


class EngineDrainingError(EngineError):
    """The worker is shutting down: requests in flight finish, new ones go elsewhere."""

    reason = "DRAINING"
