"""gRPC adapter of SemanticCache (protos/cache.proto): validation, status codes and error accounting."""

from __future__ import annotations

import logging

import grpc
from redis.exceptions import RedisError

from cache_service.core import FINISH_REASONS, SemanticCache
from cache_service.keys import NotCacheableError, parse_key
from cache_service.store import StoredAnswer
from common.gen import cache_pb2, cache_pb2_grpc

log = logging.getLogger(__name__)


class SemanticCacheServicer(cache_pb2_grpc.SemanticCacheServicer):
    def __init__(self, cache: SemanticCache, max_response_bytes: int) -> None:
        self._cache = cache
        self._max_response_bytes = max_response_bytes

    async def _fail(self, context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
        """A malformed request is the client's mistake: counted apart from the service's own failures."""
        if isinstance(exc, NotCacheableError):
            self._cache.metrics.invalid_requests.labels(method=method).inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._cache.metrics.errors.labels(method=method).inc()
        if isinstance(exc, RedisError | OSError):
            log.warning("%s: redis unavailable: %s", method, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "cache storage unavailable")
        log.exception("%s failed", method, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    async def Lookup(
        self, request: cache_pb2.LookupRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.LookupResponse:
        try:
            key = parse_key(request.key)
            threshold = request.threshold if request.HasField("threshold") else None
            if threshold is not None and not 0.0 <= threshold <= 1.0:
                raise NotCacheableError("threshold must be in [0, 1]")
            hit = await self._cache.lookup(key, threshold, request.level)
        except Exception as exc:  # mapped to a status code
            await self._fail(context, "Lookup", exc)
            raise
        if hit is None:
            return cache_pb2.LookupResponse(hit=False)
        a = hit.answer
        return cache_pb2.LookupResponse(
            hit=True,
            entry_id=hit.entry_id,
            response=a.response,
            similarity=hit.similarity,
            exact=hit.exact,
            tier=hit.tier,
            finish_reason=a.finish_reason,
            prompt_tokens=a.prompt_tokens,
            completion_tokens=a.completion_tokens,
        )

    async def Store(
        self, request: cache_pb2.StoreRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.StoreResponse:
        try:
            key = parse_key(request.key)
            if request.HasField("ttl_seconds") and request.ttl_seconds <= 0:
                raise NotCacheableError("ttl_seconds must be positive")
            answer = answer_of(request, self._max_response_bytes)
            ttl = request.ttl_seconds if request.HasField("ttl_seconds") else None
            entry_id = await self._cache.put(key, answer, ttl)
        except Exception as exc:  # mapped to a status code
            await self._fail(context, "Store", exc)
            raise
        return cache_pb2.StoreResponse(stored=entry_id is not None, entry_id=entry_id or "")

    async def Invalidate(
        self, request: cache_pb2.InvalidateRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.InvalidateResponse:
        try:
            target = request.WhichOneof("target")
            if target == "entry_id":
                removed = await self._cache.invalidate_entry(request.entry_id)
            elif target == "scope":
                removed = await self._cache.invalidate_scope(request.scope)
            else:
                raise NotCacheableError("set entry_id or scope")
        except Exception as exc:  # mapped to a status code
            await self._fail(context, "Invalidate", exc)
            raise
        return cache_pb2.InvalidateResponse(removed=removed)

    async def GetStats(
        self, request: cache_pb2.CacheStatsRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.CacheStats:
        c = self._cache.counts
        return cache_pb2.CacheStats(
            entries=len(self._cache.index), lookups=c.lookups, hits=c.hits, misses=c.misses, stores=c.stores
        )


def answer_of(request: cache_pb2.StoreRequest, max_response_bytes: int) -> StoredAnswer:
    """The answer a Store hands over, refused where no worker's answer looks like it. A known finish reason
    that is not worth storing ("tool_calls", "abort") is no mistake: SemanticCache.put declines it."""
    if not request.response:
        raise NotCacheableError("response is empty")
    size = len(request.response.encode())
    if size > max_response_bytes:
        raise NotCacheableError(
            f"response is {size} bytes; at most {max_response_bytes} (CACHE_MAX_RESPONSE_BYTES)"
        )
    if request.finish_reason not in FINISH_REASONS:
        known = ", ".join(FINISH_REASONS)
        raise NotCacheableError(f"finish_reason must be one of {known}, not {request.finish_reason!r}")
    for field in ("prompt_tokens", "completion_tokens"):
        if getattr(request, field) < 0:
            raise NotCacheableError(f"{field} must not be negative")
    return StoredAnswer(
        request.response, request.finish_reason, request.prompt_tokens, request.completion_tokens
    )
