"""Process wiring: Redis, the embedding model, the index and its sync, gRPC (with health and reflection)
and the metrics HTTP server; graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from threadpoolctl import threadpool_limits

from cache_service.core import SemanticCache
from cache_service.embedder import Embedder, MicroBatcher
from cache_service.index import VectorIndex, default_scan_threads
from cache_service.metrics import CacheMetrics
from cache_service.service import SemanticCacheServicer
from cache_service.settings import CacheSettings
from cache_service.store import RedisStore
from cache_service.sync import IndexSync
from cache_service.verifier import PairVerifier
from services.gen import cache_pb2, cache_pb2_grpc

log = logging.getLogger("cache_service")
HEALTH_PERIOD_S = 1.0
SERVICE_NAME = cache_pb2.DESCRIPTOR.services_by_name["SemanticCache"].full_name


async def watch_redis(store: RedisStore, health_servicer: health.aio.HealthServicer, period_s: float) -> None:
    """Report NOT_SERVING while Redis is unreachable (lookups fail then), SERVING again once it answers."""
    serving: bool | None = None
    while True:
        try:
            ok = await asyncio.wait_for(store.ping(), timeout=period_s)
        except Exception:  # any failure means not serving
            ok = False
        if ok != serving:
            status = (
                health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, status)
            if serving is not None:
                log.warning("redis %s", "reachable again" if ok else "unreachable: reporting NOT_SERVING")
            serving = ok
        await asyncio.sleep(period_s)


def limit_blas_threads() -> None:
    """One BLAS thread for numpy (the index's exact re-scoring of a few rows): a multi-threaded BLAS
    spinning for a core the embedder or the gRPC loop holds is 10-50x slower (measured on 2 busy cores).
    The scan itself is torch's (cache_service/index.py), split over blocking threads of its own."""
    threadpool_limits(limits=1, user_api="blas")


async def serve(settings: CacheSettings) -> None:
    limit_blas_threads()
    metrics = CacheMetrics()
    store = RedisStore(settings.redis_url)
    await store.ping()
    embedder = await asyncio.to_thread(
        Embedder, num_threads=settings.embedding_threads, dtype=settings.embedding_dtype
    )
    batcher = MicroBatcher(embedder, settings.embed_max_batch, on_batch=metrics.on_embedding_batch)
    batcher.start()
    index = VectorIndex(embedder.dim, scan_threads=default_scan_threads())
    replica_id = uuid.uuid4().hex
    sync = IndexSync(
        store, index, replica_id, settings.resync_seconds, on_change=lambda: metrics.entries.set(len(index))
    )
    await sync.start()
    # Build the int8 sketches of what was loaded before serving, so the first lookups after a start run at
    # steady-state speed (about 0.4 s of one core per 100k entries) instead of racing the build.
    index.settle(timeout=300, rebuild=True)
    cache = SemanticCache(
        store,
        batcher,
        index,
        metrics,
        replica_id=replica_id,
        threshold=settings.similarity_threshold,
        ttl_seconds=settings.ttl_seconds,
        verifier=PairVerifier(embedder) if settings.verifier_enabled else None,
        verifier_threshold=settings.verifier_threshold,
    )

    server = grpc.aio.server()
    cache_pb2_grpc.add_SemanticCacheServicer_to_server(SemanticCacheServicer(cache), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    address = f"{settings.host}:{settings.port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"cannot bind {address}")
    await server.start()
    if settings.metrics_port:
        metrics.serve(settings.host, settings.metrics_port)
    watcher = asyncio.create_task(watch_redis(store, health_servicer, HEALTH_PERIOD_S))
    log.info(
        "cache service on %s (%d entries, threshold %.2f, embedder %s, %d torch thread(s), %d scan threads)",
        address,
        len(index),
        settings.similarity_threshold,
        embedder.dtype,
        embedder.num_threads,
        index.scan_threads,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    # Drain: health NOT_SERVING, new calls refused (UNAVAILABLE: the gateway serves without the cache),
    # calls in flight finish for up to CACHE_DRAIN_TIMEOUT_S; stop() returns as soon as none is left.
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=settings.drain_timeout_s)
    await sync.close()
    await batcher.close()
    index.close()
    await store.close()
