"""Engine errors, each with one meaning for every transport (gRPC code, HTTP status)."""


class EngineError(Exception):
    """Base class."""


class InvalidRequestError(EngineError, ValueError):
    """The request can never be served as given (bad parameters, prompt too long)."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full; retry later."""


class EngineDeadError(EngineError):
    """The engine loop has stopped; no request can be served."""
