"""/v1/embeddings from a cache service whose lookups embed in bfloat16 (a real process): the route keeps a
float32 copy of the model, so its vectors are still sentence-transformers' own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, embedding_model
from common.gen import cache_pb2, cache_pb2_grpc
from tests.cache.procs import CacheService, start_cache_service

TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "A cat sat on the mat."]


@pytest.fixture(scope="module")
def bf16_service(log_dir: Path, redis_url: str) -> Iterator[CacheService]:
    service = start_cache_service(
        log_dir, redis_url, name="cache-bf16", CACHE_EMBEDDING_DTYPE="bfloat16", LOG_FORMAT="json"
    )
    yield service
    service.proc.stop()


def test_log_format_json_gives_json_lines(bf16_service: CacheService) -> None:
    lines = [line for line in bf16_service.proc.log_path.read_text().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["logger"].startswith("cache_service") for r in records)


def test_the_route_returns_float32_vectors_when_lookups_run_bfloat16(bf16_service: CacheService) -> None:
    from sentence_transformers import SentenceTransformer

    with grpc.insecure_channel(bf16_service.addr) as channel:
        stub = cache_pb2_grpc.EmbeddingsStub(channel)
        info = stub.GetEmbeddingModel(cache_pb2.EmbeddingModelRequest(), timeout=120)
        reply = stub.Embed(
            cache_pb2.EmbedRequest(model=info.model, inputs=[cache_pb2.EmbedInput(text=t) for t in TEXTS]),
            timeout=60,
        )
    path = embedding_model(DEFAULT_EMBEDDING_MODEL).default_directory()
    reference = SentenceTransformer(path, device="cpu")
    want = reference.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True).astype(np.float64)
    got = np.asarray([list(e.values) for e in reply.embeddings], dtype=np.float64)
    assert info.model == DEFAULT_EMBEDDING_MODEL and got.shape == want.shape
    cosines = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1)
    assert cosines.min() >= 0.9999, cosines
    # float32 to rounding: the bfloat16 path's own vectors (cosine ~0.99997) would be refused here
    assert np.abs(got - want).max() < 2e-5
