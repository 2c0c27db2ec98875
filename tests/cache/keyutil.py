"""Request builders shared by the cache tests."""

from __future__ import annotations

from common.gen import cache_pb2

MODEL = "SmolLM2-135M-Instruct"


def chat_key(
    question: str,
    scope: str,
    history: list[tuple[str, str]] | None = None,
    params: str = "p0",
) -> cache_pb2.CacheKey:
    messages = [cache_pb2.Message(role=r, content=c) for r, c in history or []]
    messages.append(cache_pb2.Message(role="user", content=question))
    return cache_pb2.CacheKey(model=MODEL, scope=scope, messages=messages, params_fingerprint=params)


def store(stub, key: cache_pb2.CacheKey, response: str, ttl: int | None = None) -> cache_pb2.StoreResponse:
    req = cache_pb2.StoreRequest(
        key=key, response=response, finish_reason="stop", prompt_tokens=11, completion_tokens=7
    )
    if ttl is not None:
        req.ttl_seconds = ttl
    return stub.Store(req, timeout=30)


def lookup(stub, key: cache_pb2.CacheKey) -> cache_pb2.LookupResponse:
    return stub.Lookup(cache_pb2.LookupRequest(key=key), timeout=30)
