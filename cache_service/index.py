"""In-memory vector index: one growable float16 matrix per partition, scanned in float16, the best rows
re-scored exactly in float32.

Redis 6.2 has no vector search, so every replica keeps this copy of the embeddings held in Redis
(loaded at start, kept in step by pub/sub events and a periodic resync). Embeddings are unit-length, so a
dot product is the cosine similarity.

Precision. Rows are stored as float16 (half the memory of float32: 77 MB for 100k x 384). Rounding a unit
vector r to float16 moves each component by at most 2^-11 of itself (round to nearest, 11-bit significand;
components below float16's normal range move by at most 2^-25), so ||r16 - r|| <= 2^-11 ||r||, and for a
unit query q, |r16.q - r.q| <= ||r16 - r|| ||q|| <= 2^-11 ~ 4.9e-4 (Cauchy-Schwarz). That is the only error
in a reported similarity: the candidates are re-scored as float32(r16) . q in float32 (q itself is not
rounded), and the threshold is applied to that score.

The scan that picks those candidates is coarser: the query is rounded to float16 as well (another 2^-11),
and torch's float16 kernel accumulates in float32 and rounds the result to float16 (at most 2^-12 for
|s| <= 1), so a scan score is within SCAN_ERROR of the exact one. The scan keeps the RESCORE_ROWS best rows,
not k, so the exact top k are found unless more than RESCORE_ROWS rows score within 2 * SCAN_ERROR of the
k-th: the rows involved are then near-duplicates of each other, and any of them is as good an answer.
Likewise two stored rows closer than 2^-10 in similarity to the query may swap places.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

STORAGE_DTYPE = np.float16
SCAN_ERROR = 3 * 2.0**-11  # bound on |scan score - exact score| for unit vectors (see above), with margin
RESCORE_ROWS = 32  # rows re-scored exactly per search, at least (k if larger)
SPLIT_MIN_ROWS = 16384  # below this a scan is too short (~0.5 ms) for a second thread to pay off
MAX_SCAN_THREADS = 2


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_scan_threads() -> int:
    """Threads splitting one scan: the CPUs this process may use, capped at 2 (measured on 2 cores)."""
    return max(1, min(MAX_SCAN_THREADS, usable_cpus()))


@dataclass(frozen=True)
class Candidate:
    entry_id: str
    query: str
    similarity: float


class Scanner:
    """Float16 matrix-vector products, split over `threads` threads when torch itself runs one thread.

    The caller (the event-loop thread) computes the first slice and blocks until the helpers have done the
    others, so no index mutation (which happens on that thread only) can overlap a scan. Helpers block instead
    of spinning, unlike torch's OpenMP workers: when another process holds a core, the split scan degrades to
    the single-threaded time rather than waiting a scheduler slice per product.
    """

    def __init__(self, threads: int = 1) -> None:
        self.threads = max(1, threads)
        self._pool = (
            ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="scan")
            if self.threads > 1
            else None
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def mv(self, rows: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        n = rows.shape[0]
        parts = self.threads if torch.get_num_threads() == 1 and n >= SPLIT_MIN_ROWS else 1
        if parts == 1 or self._pool is None:
            return torch.mv(rows, query)  # torch's own intra-op threads, if it has several
        out = torch.empty(n, dtype=rows.dtype)
        bounds = [n * i // parts for i in range(parts + 1)]
        futures: list[Future[torch.Tensor]] = []
        try:
            for a, b in zip(bounds[1:-1], bounds[2:], strict=True):
                futures.append(self._pool.submit(torch.mv, rows[a:b], query, out=out[a:b]))
            torch.mv(rows[: bounds[1]], query, out=out[: bounds[1]])
        finally:
            for fut in futures:  # even on an error: the helpers read the matrix, which must outlive them
                fut.exception()
        for fut in futures:
            fut.result()
        return out


_SERIAL = Scanner(1)


class Partition:
    """Rows of one partition; removal swaps the last row into the hole so rows stay contiguous."""

    def __init__(self, dim: int, scope: str, scanner: Scanner | None = None) -> None:
        self.scope = scope
        self._matrix = np.zeros((8, dim), dtype=STORAGE_DTYPE)
        self._ids: list[str] = []
        self._queries: list[str] = []
        self._rows: dict[str, int] = {}
        self._scanner = scanner or _SERIAL

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._rows

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    @property
    def nbytes(self) -> int:
        return self._matrix.nbytes

    def add(self, entry_id: str, vector: np.ndarray, query: str) -> None:
        row = self._rows.get(entry_id)
        if row is None:
            row = len(self._ids)
            if row == self._matrix.shape[0]:
                grown = np.zeros((row * 2, self._matrix.shape[1]), dtype=STORAGE_DTYPE)
                grown[:row] = self._matrix
                self._matrix = grown
            self._ids.append(entry_id)
            self._queries.append(query)
            self._rows[entry_id] = row
        else:
            self._queries[row] = query
        self._matrix[row] = vector  # rounded to nearest float16

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
        """The k most similar rows at or above min_similarity, best first; similarities in float32."""
        n = len(self._ids)
        if n == 0 or k <= 0:
            return []
        query = np.ascontiguousarray(vector, dtype=np.float32)
        pool = max(RESCORE_ROWS, k)
        if n <= pool:
            rows = np.arange(n)
        else:  # float16 scan, then the best `pool` rows (unordered)
            scores = self._scanner.mv(
                torch.from_numpy(self._matrix[:n]), torch.from_numpy(query.astype(STORAGE_DTYPE))
            )
            rows = torch.topk(scores, pool, sorted=False).indices.numpy()
        exact = self._matrix[rows].astype(np.float32) @ query
        best = np.argsort(-exact, kind="stable")[:k]
        return [
            Candidate(self._ids[i], self._queries[i], float(s))
            for i, s in zip(rows[best].tolist(), exact[best].tolist(), strict=True)
            if s >= min_similarity
        ]


class VectorIndex:
    """Partitions by key; `scan_threads` threads split each large scan (see Scanner)."""

    def __init__(self, dim: int, scan_threads: int = 1) -> None:
        self.dim = dim
        self._scanner = Scanner(scan_threads)
        self._partitions: dict[str, Partition] = {}
        self._owner: dict[str, str] = {}  # entry id -> partition

    def __len__(self) -> int:
        return len(self._owner)

    @property
    def scan_threads(self) -> int:
        return self._scanner.threads

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._owner

    def close(self) -> None:
        self._scanner.close()

    def entry_ids(self) -> set[str]:
        return set(self._owner)

    def add(self, entry_id: str, partition: str, scope: str, vector: np.ndarray, query: str) -> None:
        old = self._owner.get(entry_id)
        if old is not None and old != partition:
            self.remove(entry_id)
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = Partition(self.dim, scope, self._scanner)
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
