"""The gRPC process wiring the worker and the cache service share: grpc.health.v1 and server reflection on the
service's own port, a health watcher that follows a readiness check, and SIGTERM/SIGINT as a stop event.

    server = GrpcServer(SERVICE_NAME, options)
    add_XServicer_to_server(servicer, server.server)
    await server.start(address)              # SERVING, reflection on
    server.watch(check, period_s)            # NOT_SERVING while check() is false, SERVING again after
    await wait_for_stop_signal()
    await server.begin_shutdown()            # watcher stopped, health NOT_SERVING: clients go elsewhere
    ...drain...
    await server.server.stop(grace_s)
    ...
    skip_final_collection()                  # in main(), once the event loop has returned
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

Check = Callable[[], bool | Awaitable[bool]]


class GrpcServer:
    """One grpc.aio server with health (the server as a whole, "", and `service_name`) and reflection.
    `also_serves`: more services on the same port, in reflection and health too; their health is SERVING
    from the start until the drain, whatever the watcher reads (their readiness is not `service_name`'s)."""

    def __init__(
        self, service_name: str, options: Sequence[tuple[str, Any]] = (), also_serves: Sequence[str] = ()
    ) -> None:
        self.service_name = service_name
        self.also_serves = tuple(also_serves)
        self.server = grpc.aio.server(options=list(options))
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (service_name, *self.also_serves, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        self._watcher: asyncio.Task[None] | None = None

    async def start(self, address: str) -> None:
        """Bind (an address that cannot be bound is an error, not a silent second listener) and serve."""
        if self.server.add_insecure_port(address) == 0:
            raise RuntimeError(f"cannot bind {address}")
        await self.set_serving(True)
        for name in self.also_serves:
            await self.health.set(name, SERVING)
        await self.server.start()

    async def set_serving(self, serving: bool) -> None:
        for name in ("", self.service_name):
            await self.health.set(name, SERVING if serving else NOT_SERVING)

    def watch(self, check: Check, period_s: float, on_change: Callable[[bool], None] | None = None) -> None:
        """Poll `check` every `period_s`; health follows it (an exception counts as not serving)."""
        self._watcher = asyncio.create_task(self._watch(check, period_s, on_change))

    async def _watch(self, check: Check, period_s: float, on_change: Callable[[bool], None] | None) -> None:
        serving = True
        while True:
            try:
                result = check()
                ok = bool(await result) if inspect.isawaitable(result) else bool(result)
            except Exception:  # any failure of the check means not serving
                ok = False
            if ok != serving:
                await self.set_serving(ok)
                if on_change is not None:
                    on_change(ok)
                serving = ok
            await asyncio.sleep(period_s)

    async def begin_shutdown(self) -> None:
        """Stop the watcher and report NOT_SERVING for good; calls in flight go on until server.stop()."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self.health.enter_graceful_shutdown()


async def wait_for_stop_signal() -> None:
    """Return on the first SIGTERM or SIGINT (both start a drain in our services)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger(__name__).info("stop signal received")


def skip_final_collection() -> None:
    """Leave the objects still alive to the OS at exit: the interpreter's last garbage collection walks every
    object of the model and its libraries, a second or two after the server has already stopped."""
    gc.freeze()
