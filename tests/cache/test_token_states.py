"""The memory of word-piece states in front of the embedder, with a stand-in encoder (no model)."""

from __future__ import annotations

import numpy as np

from cache_service.token_states import TokenStateCache, TokenStates


class CountingEncoder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode_tokens(self, texts: list[str]) -> list[TokenStates]:
        self.calls.append(list(texts))
        out = []
        for text in texts:
            pieces = max(1, len(text.split()))
            vec = np.full(4, float(len(text)), dtype=np.float32)
            ctx = np.ones((pieces, 4), dtype=np.float32)
            out.append(TokenStates(vec, tuple(range(pieces)), ctx, ctx.copy()))
        return out


def _bytes(words: int) -> int:
    return 4 * 4 + 2 * words * 4 * 4 + 8 * words


def test_remembered_texts_skip_the_model_and_the_rest_go_in_one_pass() -> None:
    enc = CountingEncoder()
    counts: list[tuple[int, int]] = []
    cache = TokenStateCache(enc, capacity_mb=1, on_encode=lambda found, new: counts.append((found, new)))
    first = cache.encode_tokens(["a b", "c d e"])
    again = cache.encode_tokens(["c d e", "f", "a b", "f"])
    assert enc.calls == [["a b", "c d e"], ["f"]]
    assert again[0] is first[1] and again[2] is first[0]
    assert again[1] is again[3]
    assert counts == [(0, 2), (2, 1)]
    vectors = cache.encode(["a b", "f"])
    assert vectors.shape == (2, 4) and vectors.dtype == np.float32
    assert vectors[0, 0] == 3.0 and vectors[1, 0] == 1.0
    assert len(enc.calls) == 2  # encode() reads the remembered states too


def test_memory_stays_under_its_bound_least_recently_used_out() -> None:
    enc = CountingEncoder()
    cache = TokenStateCache(enc, capacity_mb=3 * _bytes(2) / 2**20)
    cache.encode_tokens(["a a", "b b", "c c"])
    assert len(cache) == 3 and cache.bytes == 3 * _bytes(2)
    cache.encode_tokens(["a a"])  # now the most recent
    cache.encode_tokens(["d d"])  # pushes out the least recent: "b b"
    assert "b b" not in cache and "a a" in cache and "d d" in cache
    assert cache.bytes <= cache.capacity_bytes
    cache.encode_tokens([" ".join("x" * 50)])  # larger than the whole budget: used, never kept
    assert len(cache) == 3 and cache.bytes == 3 * _bytes(2)


def test_zero_capacity_remembers_nothing() -> None:
    enc = CountingEncoder()
    cache = TokenStateCache(enc, capacity_mb=0)
    cache.encode_tokens(["a"])
    cache.encode_tokens(["a"])
    assert enc.calls == [["a"], ["a"]] and len(cache) == 0
