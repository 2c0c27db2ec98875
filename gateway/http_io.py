"""Request plumbing shared by the routes: API key check, bounded body reads, racing client disconnects, and
the base of the gateway's pure-ASGI middlewares."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import APIError

T = TypeVar("T")


class HttpMiddleware:
    """A pure-ASGI middleware (no BaseHTTPMiddleware: streamed bodies pass through untouched). Other scopes
    (lifespan) go straight to the app; an HTTP request goes to `handle`, which runs the app through
    `call_app` to see (and may change) the response's start message: status and headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError

    async def call_app(
        self, scope: Scope, receive: Receive, send: Send, on_start: Callable[[Message], None]
    ) -> None:
        async def send_watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                on_start(message)
            await send(message)

        await self.app(scope, receive, send_watched)


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


def check_api_key(request: Request, api_key: str | None) -> None:
    """With API_KEY set, every /v1 call must send `Authorization: Bearer <API_KEY>`."""
    if not api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        message = "Incorrect API key provided." if header else "You didn't provide an API key."
        raise APIError(401, message, "invalid_request_error", None, "invalid_api_key")


def _too_large(limit: int) -> APIError:
    message = f"The request body exceeds the limit of {limit} bytes."
    return APIError(413, message, "invalid_request_error", None, "request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(
    request: Request, work: Awaitable[T], discard: Callable[[T], None] | None = None
) -> T:
    """Await `work` unless the client goes away first; then cancel it and raise ClientDisconnected.

    `discard` releases a result that completed while it was being cancelled.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    if discard is not None and not isinstance(outcome, BaseException):
        discard(outcome)
    raise ClientDisconnected()
