"""Graceful shutdown for the gateway: on SIGTERM stop admitting, let requests in flight finish, exit 0.

uvicorn's own SIGTERM handling closes the listening socket at once (new clients see connection
refused, not an answer) and re-raises the signal at the end, so the process exits by SIGTERM rather
than with 0. Here the first signal only starts a drain: /ready turns 503, new API requests get a 503
in the OpenAI shape, and the server exits once nothing is in flight or GATEWAY_DRAIN_TIMEOUT_S has
passed. A second signal ends the drain at once.
"""

from __future__ import annotations

import logging
import time
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import unavailable

log = logging.getLogger(__name__)

API_PREFIX = "/v1/"


class DrainGate:
    """Counts API requests in flight (streams until their last byte) and says when to refuse new ones."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0

    def start_drain(self) -> None:
        self.draining = True


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
        self.gate.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.in_flight -= 1


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains instead of stopping."""

    def __init__(self, config: uvicorn.Config, gate: DrainGate, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.gate = gate
        self.drain_timeout_s = drain_timeout_s
        self.drain_deadline = 0.0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gate.draining:
            self.should_exit = True  # a second signal: stop now
            return
        self.gate.start_drain()
        self.drain_deadline = time.monotonic() + self.drain_timeout_s

    async def on_tick(self, counter: int) -> bool:
        if self.gate.draining and not self.should_exit:
            if counter % 10 == 0 or self.gate.in_flight == 0:
                log.info("draining: %d request(s) in flight", self.gate.in_flight)
            if self.gate.in_flight == 0 or time.monotonic() >= self.drain_deadline:
                return True
        return await super().on_tick(counter)
