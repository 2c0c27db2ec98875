"""/v1/embeddings inputs and the cache's lookups in the same forward passes of the real embedder (the packaged
MiniLM, in process): one model, one queue, the vectors each would get alone and sentence-transformers'."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from cache_service.batcher import BatchStats, MicroBatcher
from cache_service.embedder import Embedder
from cache_service.embeddings import EmbeddingInputError, InputReader, same_model
from cache_service.metrics import CacheMetrics
from common.gen import cache_pb2

LOOKUPS = ["How do I reset my password?", "What's the capital of France?"]
INPUTS = ["Paris is the capital of France.", "A cat sat on the mat.", "hi"]


class CountingEmbedder:
    """The real embedder, its passes recorded; the first pass waits for `gate`, so what arrives meanwhile
    queues up behind it as it does behind a busy pass."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.passes: list[list[list[int]]] = []
        self.gate = threading.Event()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.embedder.tokenize(texts)

    def encode_ids(self, rows: list[list[int]]) -> np.ndarray:
        if not self.passes:
            self.gate.wait(30)
        self.passes.append(rows)
        return self.embedder.encode_ids(rows)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


async def test_lookups_and_embedding_inputs_share_one_forward_pass(embedder: Embedder) -> None:
    reader = InputReader.of(embedder)
    counting = CountingEmbedder(embedder)
    metrics = CacheMetrics()
    stats: list[BatchStats] = []

    def on_batch(s: BatchStats) -> None:
        stats.append(s)
        metrics.on_embedding_batch(s)

    batcher = MicroBatcher(counting, max_batch=32, on_batch=on_batch)
    batcher.start()
    try:
        busy = asyncio.ensure_future(batcher.embed("a pass already running"))
        await asyncio.sleep(0.05)
        ids = [reader.token_ids(cache_pb2.EmbedInput(text=t), None) for t in INPUTS]
        waiting = [
            *(asyncio.ensure_future(batcher.embed(t)) for t in LOOKUPS),
            asyncio.ensure_future(batcher.embed_ids(ids)),
        ]
        await asyncio.sleep(0.05)
        counting.gate.set()
        *lookup_vectors, input_vectors = await asyncio.gather(*waiting)
        await busy
    finally:
        await batcher.close()
    assert len(counting.passes) == 2, "the lookups and the embeddings request ran in one pass"
    assert (stats[1].lookups, stats[1].embeddings, stats[1].mix) == (2, 3, "mixed")
    assert sorted(counting.passes[1]) == sorted([*embedder.tokenize(LOOKUPS), *ids])
    assert metrics.registry.get_sample_value("llmserve_cache_embedding_batches_total", {"mix": "mixed"}) == 1
    inputs_total = metrics.registry.get_sample_value
    assert inputs_total("llmserve_cache_embedding_inputs_total", {"kind": "embedding"}) == 3
    assert inputs_total("llmserve_cache_embedding_inputs_total", {"kind": "lookup"}) == 3
    # each the vector it gets alone, and sentence-transformers' own
    for text, vector in zip(LOOKUPS, lookup_vectors, strict=True):
        assert np.allclose(vector, embedder.encode([text])[0], atol=1e-5)
    for row, vector in zip(ids, input_vectors, strict=True):
        assert np.allclose(vector, embedder.encode_ids([row])[0], atol=1e-5)
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(embedder.path, device="cpu").encode(INPUTS, convert_to_numpy=True)
    cosines = np.sum(np.asarray(input_vectors, dtype=np.float64) * reference, axis=1)
    assert cosines.min() >= 0.9999, cosines


def test_inputs_get_the_special_tokens_and_are_cut_or_refused_at_the_length(embedder: Embedder) -> None:
    reader = InputReader.of(embedder)
    text = " ".join(f"word{i}" for i in range(300))
    assert reader.token_ids(cache_pb2.EmbedInput(text="hi"), None) == embedder.tokenize(["hi"])[0]
    with pytest.raises(EmbeddingInputError, match="truncate_prompt_tokens"):
        reader.token_ids(cache_pb2.EmbedInput(text=text), None)
    cut = reader.token_ids(cache_pb2.EmbedInput(text=text), 64)
    content = embedder.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(cut) == 64 and cut == [*reader.prefix, *content[-62:], *reader.suffix]
    with pytest.raises(EmbeddingInputError, match="vocabulary"):
        reader.token_ids(cache_pb2.EmbedInput(token_ids=cache_pb2.TokenIds(ids=[10**6])), None)


def test_token_ids_read_alike_with_or_without_the_special_tokens(embedder: Embedder) -> None:
    """`tokenizer(text)["input_ids"]`, the usual way to tokenize, includes [CLS] ... [SEP]: the model must not
    read them twice (a vector 0.84 in cosine from the text's)."""
    reader = InputReader.of(embedder)
    text = "a question"
    expected = reader.token_ids(cache_pb2.EmbedInput(text=text), None)
    with_special = embedder.tokenizer(text)["input_ids"]
    without = embedder.tokenizer(text, add_special_tokens=False)["input_ids"]
    for ids in (with_special, without):
        assert reader.token_ids(cache_pb2.EmbedInput(token_ids=cache_pb2.TokenIds(ids=ids)), None) == expected


def test_model_names() -> None:
    assert same_model("sentence-transformers/all-MiniLM-L6-v2", "all-minilm-l6-v2")
    assert same_model("all-minilm-l6-v2", "all-minilm-l6-v2")
    assert not same_model("all-mpnet-base-v2", "all-minilm-l6-v2")
