"""Remembered forward passes: the word-piece states of texts the service has recently embedded.

A semantic hit needs the query's sentence vector (to search) and, for the verifier, the word-piece states of
the query and of the candidate it found. Both come out of the same forward pass of the embedding model, so
this cache sits in front of the Embedder: embedding a question keeps its states, and the verifier then
finds the query (embedded a moment ago) and the candidate (embedded when it was stored, or when it was
last looked up) without running the model again. On this 2-core machine that halves a semantic hit: one
forward pass of ~20 ms instead of two (docs/SEMANTIC_CACHE_STUDIES.md).

Bounded by the bytes the states take (CACHE_TOKEN_STATE_MB; a 10-word question ~45 KB, a 1,000-character
one ~0.8 MB), least recently used first out. A text that has fallen out is simply encoded again. Used from
the embedding thread (MicroBatcher); the lock makes it safe from any other thread too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class TokenStates:
    """One text's forward pass: its sentence vector and, per word piece (specials and punctuation dropped),
    the piece id, its L2-normalized contextual vector and its L2-normalized static vector."""

    sentence: np.ndarray  # (dim,)
    ids: tuple[int, ...]
    context: np.ndarray  # (pieces, dim)
    static: np.ndarray  # (pieces, dim)


DEFAULT_CAPACITY_MB = 256  # ~6,000 short questions (MiniLM with two layers in its contextual vectors: ~45 KB)


class TokenEncoder(Protocol):
    def encode_tokens(self, texts: list[str]) -> list[TokenStates]: ...


def _size(states: TokenStates) -> int:
    return states.sentence.nbytes + states.context.nbytes + states.static.nbytes + 8 * len(states.ids)


class TokenStateCache:
    """encode_tokens / encode with the states of recently seen texts kept; one forward pass for the rest."""

    def __init__(
        self,
        encoder: TokenEncoder,
        capacity_mb: float = DEFAULT_CAPACITY_MB,
        on_encode: Callable[[int, int], None] | None = None,
    ) -> None:
        self._encoder = encoder
        self._on_encode = on_encode  # (distinct texts found in memory, texts to encode) per call
        self.capacity_bytes = int(capacity_mb * 1024 * 1024)
        self._states: OrderedDict[str, TokenStates] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, text: str) -> bool:
        with self._lock:
            return text in self._states

    def encode_tokens(self, texts: list[str]) -> list[TokenStates]:
        found: dict[str, TokenStates] = {}
        with self._lock:
            for text in texts:
                states = self._states.get(text)
                if states is not None:
                    self._states.move_to_end(text)
                    found[text] = states
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if self._on_encode is not None:
            self._on_encode(len(found), len(missing))
        if missing:
            fresh = self._encoder.encode_tokens(missing)
            found.update(zip(missing, fresh, strict=True))
            with self._lock:
                for text, states in zip(missing, fresh, strict=True):
                    self._keep(text, states)
        return [found[t] for t in texts]

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit sentence vectors (float32), as Embedder.encode, keeping every text's states."""
        return np.stack([s.sentence for s in self.encode_tokens(texts)])

    def _keep(self, text: str, states: TokenStates) -> None:
        size = _size(states)
        if size > self.capacity_bytes:
            return
        old = self._states.pop(text, None)
        if old is not None:
            self.bytes -= _size(old)
        self._states[text] = states
        self.bytes += size
        while self.bytes > self.capacity_bytes:
            _, dropped = self._states.popitem(last=False)
            self.bytes -= _size(dropped)
