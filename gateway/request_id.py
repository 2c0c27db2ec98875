"""X-Request-Id: taken from the client when it sends one (else made here), returned on every response,
set for the gateway's logs and sent to the worker as gRPC metadata, which logs it with the request."""

from __future__ import annotations

import re
import uuid

from starlette.types import Message, Receive, Scope, Send

from common.logs import REQUEST_ID
from gateway.http_io import HttpMiddleware

HEADER = b"x-request-id"
METADATA_KEY = "x-request-id"
_ACCEPTABLE = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")  # anything else is replaced, never echoed


def grpc_metadata() -> tuple[tuple[str, str], ...]:
    request_id = REQUEST_ID.get()
    return ((METADATA_KEY, request_id),) if request_id else ()


class RequestIdMiddleware(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = dict(scope["headers"]).get(HEADER, b"").decode("latin-1")
        request_id = sent if _ACCEPTABLE.match(sent) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)

        def add_id(message: Message) -> None:
            message["headers"] = [*message.get("headers", []), (HEADER, request_id.encode())]

        try:
            await self.call_app(scope, receive, send, add_id)
        finally:
            REQUEST_ID.reset(token)
