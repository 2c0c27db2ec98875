"""`python -m worker`: load the model, start the engine, serve gRPC (health, reflection) and metrics.

Health is SERVING only while the engine loop is alive, not stalled (no progress for
WORKER_STALL_TIMEOUT_S while requests wait) and not draining. SIGTERM drains: health turns
NOT_SERVING, new requests are refused as UNAVAILABLE (the gateway tries another replica), requests
in flight finish for up to WORKER_DRAIN_TIMEOUT_S, then the process exits 0. If the engine loop dies
(a bug: it never stops on its own), the process exits 1, as vLLM's server does when its engine core dies, so
that what supervises it (make run, compose's restart policy, Kubernetes) starts a fresh one: a live process
that can serve nothing would otherwise stay NOT_SERVING until someone restarted it by hand.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from common.cpus import format_cpu_list, pin_process, usable_cpus
from common.gen import worker_pb2, worker_pb2_grpc
from common.grpc_server import GrpcServer, skip_final_collection, wait_for_stop_signal
from common.logs import configure_logging
from worker.engine.async_engine import AsyncEngine
from worker.model.build import build_async_engine
from worker.server.metrics import start_metrics_server
from worker.server.servicer import WorkerServicer
from worker.server.settings import WorkerSettings

log = logging.getLogger("worker")

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
HEALTH_POLL_S = 0.25
DRAIN_POLL_S = 0.1
SHUTDOWN_GRACE_S = 1.0  # after the drain: calls still open are cut after this
MAX_CONNECTION_AGE_MS = 30_000  # see serve(): lets clients of a scaled service find new replicas


def engine_serving(engine: AsyncEngine) -> bool:
    return engine.is_running and not engine.is_stalled


def _log_engine_health(engine: AsyncEngine, serving: bool) -> None:
    """Health follows the engine (common/grpc_server.py), so health checks, run_stack and the gateway's
    /ready see a loop that died or stalled; a stall that clears is SERVING again."""
    if engine.is_running:
        log.warning("engine %s", "moving again: SERVING" if serving else "stalled: NOT_SERVING")


async def drain(engine: AsyncEngine, timeout_s: float) -> int:
    """Refuse new requests and wait for those in flight; returns how many were still open at the end."""
    engine.stop_admitting()
    deadline = asyncio.get_running_loop().time() + timeout_s
    while engine.num_in_flight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    return engine.num_in_flight


async def engine_death(engine: AsyncEngine) -> None:
    """Return once the engine loop has died."""
    while engine.is_running:
        await asyncio.sleep(HEALTH_POLL_S)


async def stop_or_engine_death(engine: AsyncEngine) -> bool:
    """Wait for a stop signal or the engine loop's death; True when the engine died."""
    waits = {asyncio.ensure_future(wait_for_stop_signal()), asyncio.ensure_future(engine_death(engine))}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return not engine.is_running


async def serve(settings: WorkerSettings) -> int:
    """Serve until a stop signal (returns 0, after the drain) or the engine loop's death (returns 1)."""
    log.info("loading %s (dtype %s, device %s)", settings.model, settings.dtype, settings.device)
    engine = build_async_engine(
        settings.engine_config(),
        stall_timeout_s=settings.stall_timeout_s,
        debug_stall_file=settings.debug_stall_file,
    )
    await engine.start()
    metrics = start_metrics_server(engine, settings)

    # so_reuseport off: a second worker on the same port must fail, not silently share it.
    # max_connection_age: every client connection is closed (GOAWAY; calls in flight finish) after about
    # 30 s, so a direct gRPC client whose dns:/// target resolves to several replicas re-resolves and finds
    # replicas added since (`--scale worker=N`); the gateway resolves WORKER_ADDR itself and reconnects its
    # load watchers (gateway/routing/membership.py).
    server = GrpcServer(
        SERVICE_NAME, [("grpc.so_reuseport", 0), ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS)]
    )
    servicer = WorkerServicer(engine, settings.stream_interval)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server.server)
    address = f"{settings.host}:{settings.port}"
    await server.start(address)
    server.watch(lambda: engine_serving(engine), HEALTH_POLL_S, lambda ok: _log_engine_health(engine, ok))
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

    died = await stop_or_engine_death(engine)
    await server.begin_shutdown()
    if died:
        log.error("the engine loop died; exiting so that a fresh worker is started")
    else:
        log.info("draining %d request(s) for up to %.0f s", engine.num_in_flight, settings.drain_timeout_s)
        left = await drain(engine, settings.drain_timeout_s)
        log.info("shutting down (%d request(s) cut off)", left)
    await engine.shutdown()  # fails what is left, so their calls end with UNAVAILABLE
    await server.server.stop(SHUTDOWN_GRACE_S)
    metrics.close()
    return 1 if died else 0


def main() -> None:
    configure_logging()  # LOG_FORMAT=json: JSON lines with the request id
    settings = WorkerSettings.from_cli(sys.argv[1:])
    if settings.cpus:  # before the engine's threads start, so they and torch's keep to these CPUs
        cpus = settings.runs_on()
        if not cpus:
            allowed = format_cpu_list(usable_cpus())
            sys.exit(f"WORKER_CPUS={settings.cpus} names no CPU this process may use (it may use {allowed})")
        pin_process(cpus)
        log.info("running on CPUs %s", format_cpu_list(cpus))
    code = asyncio.run(serve(settings))
    skip_final_collection()
    sys.exit(code)


if __name__ == "__main__":
    main()
