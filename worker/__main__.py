"""`python -m worker`: load the model, start the engine, serve gRPC (health, reflection) and metrics."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services.gen import worker_pb2, worker_pb2_grpc
from worker.async_engine import AsyncEngine
from worker.metrics import start_metrics_server
from worker.server import WorkerServicer
from worker.settings import WorkerSettings

log = logging.getLogger("worker")

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
HEALTH_POLL_S = 1.0
SHUTDOWN_GRACE_S = 5.0


async def _watch_engine(engine: AsyncEngine, health: HealthServicer) -> None:
    """Report NOT_SERVING as soon as the engine loop dies, so health checks and run_stack see it."""
    serving = True
    while True:
        alive = engine.is_running
        if alive != serving:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if alive
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in ("", SERVICE_NAME):
                await health.set(name, status)
            serving = alive
        await asyncio.sleep(HEALTH_POLL_S)


async def serve(settings: WorkerSettings) -> None:
    log.info("loading %s (dtype %s, device %s)", settings.model, settings.dtype, settings.device)
    engine = AsyncEngine.from_config(settings.engine_config())
    await engine.start()
    metrics = start_metrics_server(engine, settings)

    # so_reuseport off: a second worker on the same port must fail, not silently share it.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(engine, settings.stream_interval), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    address = f"{settings.host}:{settings.port}"
    server.add_insecure_port(address)
    await server.start()
    watcher = asyncio.create_task(_watch_engine(engine, health))
    info = engine.model_info
    log.info(
        "worker serving %s on %s (metrics :%d, %d KV blocks of %d tokens, max_model_len %d)",
        info.model_name,
        address,
        settings.metrics_port,
        info.num_kv_blocks,
        info.block_size,
        info.max_model_len,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    log.info("shutting down")
    watcher.cancel()
    await health.enter_graceful_shutdown()
    await server.stop(SHUTDOWN_GRACE_S)
    await engine.shutdown()
    metrics.close()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(WorkerSettings.from_cli(sys.argv[1:])))


if __name__ == "__main__":
    main()
