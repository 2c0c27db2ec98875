"""Graceful shutdown for the gateway: on SIGTERM stop admitting, let requests in flight finish, exit 0.

uvicorn's own SIGTERM handling closes the listening socket at once (new clients see connection
refused, not an answer) and re-raises the signal at the end, so the process exits by SIGTERM rather
than with 0. Here the first signal only starts a drain: /ready turns 503, new API requests get a 503
in the OpenAI shape, and the server exits once nothing is in flight or GATEWAY_DRAIN_TIMEOUT_S has
passed. A second signal ends the drain at once.

Requests still open when the drain timeout passes are ended, not cut off: a stream gets an error event
in the OpenAI shape and `data: [DONE]` (as when a worker dies mid-stream), a request with no answer yet
gets a 503, and their worker calls are cancelled, so the workers free their KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import unavailable
from gateway.responses import SSE_DONE, sse

log = logging.getLogger(__name__)

API_PREFIX = "/v1/"
CUT_GRACE_S = 2.0  # after the drain timeout: how long the requests ended then have to send their last bytes
CUT_MESSAGE = "The gateway shut down before the request finished (its drain timeout passed); retry it"


@dataclass(eq=False)
class OpenRequest:
    """One API request in flight: the task that runs it and how far its response has gone."""

    task: asyncio.Task
    started: bool = False
    streaming: bool = False  # an SSE body
    finished: bool = False
    cut: bool = False  # ended by the drain timeout


class DrainGate:
    """The API requests in flight (streams until their last byte) and whether new ones are refused."""

    def __init__(self) -> None:
        self.draining = False
        self.open: set[OpenRequest] = set()

    @property
    def in_flight(self) -> int:
        return len(self.open)

    def start_drain(self) -> None:
        self.draining = True

    def cut_all(self) -> int:
        """End every request in flight now (the drain timeout passed); returns how many."""
        cut = 0
        for request in self.open:
            if not request.cut and not request.finished:
                request.cut = True
                request.task.cancel()
                cut += 1
        return cut


class DrainMiddleware:
    """Pure ASGI, so a streamed response counts as in flight until it is finished."""

    def __init__(self, app: ASGIApp, gate: DrainGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        if self.gate.draining:
            await unavailable("The gateway is shutting down; retry on another replica").response()(
                scope, receive, send
            )
            return
        task = asyncio.current_task()
        assert task is not None
        request = OpenRequest(task)

        async def send_watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                request.started = True
                headers = dict(message.get("headers") or ())
                request.streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                request.finished = True
            await send(message)

        self.gate.open.add(request)
        try:
            await self.app(scope, receive, send_watched)
        except asyncio.CancelledError:
            if not request.cut:
                raise
            task.uncancel()  # the cancellation was ours: the app is unwound (worker calls cancelled)
            await self._end_cut(request, scope, receive, send)
        finally:
            self.gate.open.discard(request)

    @staticmethod
    async def _end_cut(request: OpenRequest, scope: Scope, receive: Receive, send: Send) -> None:
        """A request ended by the drain timeout: a 503, or the error event and [DONE] that end a stream."""
        error = unavailable(CUT_MESSAGE)
        if not request.started:
            await error.response()(scope, receive, send)
        elif request.streaming and not request.finished:
            tail = sse(error.body()) + SSE_DONE
            await send({"type": "http.response.body", "body": tail.encode(), "more_body": False})
        # A plain response cut half-way cannot be mended: uvicorn closes its connection.


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains instead of stopping."""

    def __init__(self, config: uvicorn.Config, gate: DrainGate, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.gate = gate
        self.drain_timeout_s = drain_timeout_s
        self.drain_deadline = 0.0
        self.cut_done = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gate.draining:
            self.should_exit = True  # a second signal: stop now
            return
        self.gate.start_drain()
        self.drain_deadline = time.monotonic() + self.drain_timeout_s

    async def on_tick(self, counter: int) -> bool:
        """Called every 0.1 s by uvicorn's main loop; True ends it (the server then shuts down)."""
        if self.gate.draining and not self.should_exit:
            if counter % 10 == 0 or self.gate.in_flight == 0:
                log.info("draining: %d request(s) in flight", self.gate.in_flight)
            if self.gate.in_flight == 0:
                return True
            now = time.monotonic()
            if now >= self.drain_deadline + CUT_GRACE_S:
                return True
            if now >= self.drain_deadline and not self.cut_done:
                self.cut_done = True
                log.warning("drain timeout passed: ending %d request(s) still open", self.gate.cut_all())
        return await super().on_tick(counter)
