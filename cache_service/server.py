"""Process wiring: Redis, the embedding model, the index and its sync, gRPC (with health and reflection)
and the metrics HTTP server; graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import uuid

from threadpoolctl import threadpool_limits

from cache_service import spelling
from cache_service.artifacts import verify as verify_artifacts
from cache_service.batcher import MicroBatcher
from cache_service.core import SemanticCache
from cache_service.embedder import Embedder
from cache_service.embeddings import EmbeddingsServicer, start_embeddings, stop_embeddings
from cache_service.index import VectorIndex, default_scan_threads
from cache_service.metrics import CacheMetrics
from cache_service.servicer import SemanticCacheServicer
from cache_service.settings import CacheSettings
from cache_service.store import RedisStore
from cache_service.sync import IndexSync
from common.gen import cache_pb2, cache_pb2_grpc
from common.grpc_server import GrpcServer, wait_for_stop_signal

log = logging.getLogger("cache_service")
HEALTH_PERIOD_S = 1.0
SERVICE_NAME = cache_pb2.DESCRIPTOR.services_by_name["SemanticCache"].full_name
EMBEDDINGS_SERVICE_NAME = cache_pb2.DESCRIPTOR.services_by_name["Embeddings"].full_name


def _log_redis_health(serving: bool) -> None:
    """Health is NOT_SERVING while Redis is unreachable (lookups fail then), SERVING again once it answers."""
    log.warning("redis %s", "reachable again" if serving else "unreachable: reporting NOT_SERVING")


def limit_blas_threads() -> None:
    """One BLAS thread for numpy (the index's exact re-scoring of a few rows): a multi-threaded BLAS
    spinning for a core the embedder or the gRPC loop holds is an order of magnitude slower.
    The scan itself is torch's (cache_service/index.py), split over blocking threads of its own."""
    threadpool_limits(limits=1, user_api="blas")


async def serve(settings: CacheSettings) -> None:
    limit_blas_threads()
    artifacts = verify_artifacts()  # `python -m cache_service` checked them already; a direct caller had not
    metrics = CacheMetrics()
    metrics.on_artifacts(artifacts.values())
    store = RedisStore(settings.redis_url)
    await store.ping()
    model = settings.model()
    embedder = await asyncio.to_thread(
        Embedder,
        settings.embedding_model_dir or None,
        settings.embedding_threads,
        settings.embedding_dtype,
        model.name,
        settings.embedding_backend,
        settings.onnx_dir or None,
    )
    batcher = MicroBatcher(
        embedder,
        settings.embed_max_batch,
        on_batch=metrics.on_embedding_batch,
        on_memo_hit=metrics.embedding_memo_hits.inc,
    )
    batcher.start()
    # /v1/embeddings: the same embedder and batcher (a float32 copy only if the lookups run a reduced type)
    embeddings = start_embeddings(embedder, batcher, metrics.on_embedding_batch, settings.onnx_dir or None)
    index = VectorIndex(embedder.dim, scan_threads=default_scan_threads())
    replica_id = uuid.uuid4().hex
    sync = IndexSync(
        store, index, replica_id, settings.resync_seconds, on_change=lambda: metrics.entries.set(len(index))
    )
    await asyncio.to_thread(spelling.load)  # ~0.5 s: before the index loads entries and the first lookup
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
    )

    # Embeddings needs no Redis: its health stays SERVING while the cache's follows Redis, until the drain
    server = GrpcServer(SERVICE_NAME, also_serves=(EMBEDDINGS_SERVICE_NAME,))
    servicer = SemanticCacheServicer(cache, settings.max_response_bytes)
    cache_pb2_grpc.add_SemanticCacheServicer_to_server(servicer, server.server)
    cache_pb2_grpc.add_EmbeddingsServicer_to_server(EmbeddingsServicer(embeddings), server.server)
    address = f"{settings.host}:{settings.port}"
    await server.start(address)
    if settings.metrics_port:
        metrics.serve(settings.host, settings.metrics_port)
    server.watch(
        lambda: asyncio.wait_for(store.ping(), timeout=HEALTH_PERIOD_S), HEALTH_PERIOD_S, _log_redis_health
    )
    log.info(
        "cache service on %s (%d entries, threshold %.2f, embedder %s %s on %s, %d thread(s), "
        "%d scan threads)",
        address,
        len(index),
        settings.similarity_threshold,
        model.name,
        embedder.dtype,
        embedder.backend,
        embedder.num_threads,
        index.scan_threads,
    )

    await wait_for_stop_signal()
    log.info("shutting down")
    # Drain: health NOT_SERVING, new calls refused (UNAVAILABLE: the gateway serves without the cache),
    # calls in flight finish for up to CACHE_DRAIN_TIMEOUT_S; stop() returns as soon as none is left.
    await server.begin_shutdown()
    await server.server.stop(grace=settings.drain_timeout_s)
    await sync.close()
    await stop_embeddings(embeddings)
    await batcher.close()
    index.close()
    await store.close()
