"""In-memory vector index: one growable float32 matrix per partition, exact cosine by one matmul.

Redis 6.2 has no vector search, so every replica keeps this copy of the embeddings held in Redis
(loaded at start, kept in step by pub/sub events and a periodic resync). Embeddings are unit-length, so a
dot product is the cosine similarity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Candidate:
    entry_id: str
    query: str
    similarity: float


class Partition:
    """Rows of one partition; removal swaps the last row into the hole so rows stay contiguous."""

    def __init__(self, dim: int, scope: str) -> None:
        self.scope = scope
        self._matrix = np.zeros((8, dim), dtype=np.float32)
        self._ids: list[str] = []
        self._queries: list[str] = []
        self._rows: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._rows

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def add(self, entry_id: str, vector: np.ndarray, query: str) -> None:
        row = self._rows.get(entry_id)
        if row is None:
            row = len(self._ids)
            if row == self._matrix.shape[0]:
                grown = np.zeros((row * 2, self._matrix.shape[1]), dtype=np.float32)
                grown[:row] = self._matrix
                self._matrix = grown
            self._ids.append(entry_id)
            self._queries.append(query)
            self._rows[entry_id] = row
        else:
            self._queries[row] = query
        self._matrix[row] = vector

    def remove(self, entry_id: str) -> bool:
        row = self._rows.pop(entry_id, None)
        if row is None:
            return False
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._matrix[row] = self._matrix[last]
            self._ids[row] = moved
            self._queries[row] = self._queries[last]
            self._rows[moved] = row
        self._ids.pop()
        self._queries.pop()
        return True

    def search(self, vector: np.ndarray, k: int, min_similarity: float) -> list[Candidate]:
        """The k most similar rows at or above min_similarity, best first."""
        n = len(self._ids)
        if n == 0:
            return []
        sims = self._matrix[:n] @ vector
        if n > k:
            top = np.argpartition(-sims, k - 1)[:k]
            top = top[np.argsort(-sims[top])]
        else:
            top = np.argsort(-sims)
        return [
            Candidate(self._ids[i], self._queries[i], float(sims[i]))
            for i in top
            if sims[i] >= min_similarity
        ]


class VectorIndex:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._partitions: dict[str, Partition] = {}
        self._owner: dict[str, str] = {}  # entry id -> partition

    def __len__(self) -> int:
        return len(self._owner)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._owner

    def entry_ids(self) -> set[str]:
        return set(self._owner)

    def add(self, entry_id: str, partition: str, scope: str, vector: np.ndarray, query: str) -> None:
        old = self._owner.get(entry_id)
        if old is not None and old != partition:
            self.remove(entry_id)
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = Partition(self.dim, scope)
        part.add(entry_id, vector, query)
        self._owner[entry_id] = partition

    def remove(self, entry_id: str) -> bool:
        partition = self._owner.pop(entry_id, None)
        if partition is None:
            return False
        part = self._partitions[partition]
        part.remove(entry_id)
        if len(part) == 0:
            del self._partitions[partition]
        return True

    def has_partition(self, partition: str) -> bool:
        return partition in self._partitions

    def ids_in_scope(self, scope: str) -> list[str]:
        return [i for p in self._partitions.values() if p.scope == scope for i in p.ids]

    def search(self, partition: str, vector: np.ndarray, k: int, min_similarity: float) -> list[Candidate]:
        part = self._partitions.get(partition)
        return part.search(vector, k, min_similarity) if part is not None else []
