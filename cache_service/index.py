"""In-memory vector index: one float16 matrix per partition (doubled when full, halved when a quarter full);
the candidates of a search, picked by an int8 sketch (large partitions) or a float16 scan, re-scored exactly
in float32.

Redis 6.2 has no vector search, so every replica keeps this copy of the embeddings held in Redis
(loaded at start, kept in step by pub/sub events and a periodic resync). Embeddings are unit-length, so a
dot product is the cosine similarity.

Precision. Rows are stored as float16 (half the memory of float32: 77 MB for 100k x 384). Rounding a unit
vector r to float16 moves each component by at most 2^-11 of itself (round to nearest, 11-bit significand;
components below float16's normal range move by at most 2^-25), so ||r16 - r|| <= 2^-11 ||r||, and for a
unit query q, |r16.q - r.q| <= ||r16 - r|| ||q|| <= 2^-11 ~ 4.9e-4 (Cauchy-Schwarz). That is the only error
in a reported similarity: the candidates are re-scored as float32(r16) . q in float32 (q itself is not
rounded), and the threshold is applied to that score.

Float16 scan (partitions below SKETCH_MIN_ROWS, or without the int8 kernel). The query is rounded to float16
as well (another 2^-11), and torch's float16 kernel accumulates in float32 and rounds the result to float16
(at most 2^-12 for |s| <= 1), so a scan score is within SCAN_ERROR of the exact one. The scan keeps the
RESCORE_ROWS best rows, not k, so the exact top k are found unless more than RESCORE_ROWS rows score within
2 * SCAN_ERROR of the k-th: the rows involved are then near-duplicates of each other, and any of them is as
good an answer. Likewise two stored rows closer than 2^-10 in similarity to the query may swap places.

Int8 sketch (cache_service/sketch.py; partitions of SKETCH_MIN_ROWS rows or more). A snapshot of the rows,
quantized per row to int8 and scanned by fbgemm against the query quantized to 8 bits: half the bytes of
the float16 scan and about half its time. Its score differs from the exact one by the two quantization
errors, sum_i (w8_i - w_i) q_i + w_i (q8_i - q_i), sums of 384 roundings that mostly cancel: standard
deviation sqrt((sw^2 + sq^2) / 12) for unit vectors (sw, sq: the row's and the query's quantization steps,
max |component| / 127 and range / 255), measured 5.1e-4, at most 2.8e-3 over 650k pairs of the service's
own embeddings (tools/cache/data/cache_eval.jsonl) and 2.6e-3 over 1M random pairs. (The worst case, every
rounding the same way, is ~0.03; no real vector comes near it.) A search takes the SKETCH_CANDIDATES (64)
best snapshot positions (removed or re-stored entries' positions are masked out of the scan), maps them
by entry id to the current rows, adds the RESCORE_ROWS best of the rows the snapshot lacks or holds an
older vector of (the "fresh" rows, scanned in float16 as above), and re-scores that union exactly in
float32. A true top-k row is therefore missed only if at least 64 - k + 1 live rows outrank it in the int8
scan, which takes that many rows within about twice the scan error (~0.006) of it: near-duplicates again,
and the row returned in its place is that close. The reported similarities and the threshold are float32
re-scores either way.

Sketch upkeep: a partition rebuilds its sketch on a background thread (SketchBuilder) when the fresh rows
plus the masked positions exceed REBUILD_FRACTION of it; the builder reads the float16 matrix in place, the
rows written meanwhile are recorded and their entries treated as fresh when the new sketch is installed
(on the event-loop thread, by the first search or write after the build finished), so a lookup never waits
for a build. While the fresh rows exceed DELTA_MAX_FRACTION of the partition (a burst of stores, the load
at start) the search scans in float16 instead. All index state changes on the event-loop thread only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from cache_service.canonical import canonical_keys
from cache_service.keys import Conversation
from cache_service.sketch import (
    DELTA_MAX_FRACTION,
    DELTA_MAX_MIN,
    MAX_BUILD_PAUSE,
    REBUILD_FRACTION,
    REBUILD_MIN_CHANGES,
    SKETCH_CANDIDATES,
    SKETCH_MIN_ROWS,
    Block,
    Int8Kernel,
    Sketch,
    SketchBuilder,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

STORAGE_DTYPE = np.float16
SCAN_ERROR = 3 * 2.0**-11  # bound on |scan score - exact score| for unit vectors (see above), with margin
RESCORE_ROWS = 32  # rows re-scored exactly per search, at least (k if larger)
SPLIT_MIN_ROWS = 16384  # below this a scan is too short (~0.5 ms) for a second thread to pay off
MAX_SCAN_THREADS = 2
MIN_CAPACITY = 8  # rows a partition's arrays start with and never shrink below


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

    def parts(self, n: int) -> int:
        """Threads a scan of n rows is split over: all of them only when torch itself runs one thread (else
        its own intra-op threads do the splitting) and the scan is long enough to pay for it."""
        split = self._pool is not None and torch.get_num_threads() == 1 and n >= SPLIT_MIN_ROWS
        return self.threads if split else 1

    def run(self, tasks: list[Callable[[], T]]) -> list[T]:
        """Runs tasks[1:] on the helper threads and tasks[0] on this one; returns all results once all are
        done."""
        if len(tasks) == 1 or self._pool is None:
            return [task() for task in tasks]
        futures: list[Future[T]] = []
        try:
            for task in tasks[1:]:
                futures.append(self._pool.submit(task))
            first = tasks[0]()
        finally:
            for fut in futures:  # even on an error: the helpers read the rows, which must outlive them
                fut.exception()
        return [first] + [fut.result() for fut in futures]

    def mv(self, rows: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        n = rows.shape[0]
        parts = self.parts(n)
        if parts == 1:
            return torch.mv(rows, query)
        out = torch.empty(n, dtype=rows.dtype)
        bounds = [n * i // parts for i in range(parts + 1)]
        self.run(
            [
                (lambda a=a, b=b: torch.mv(rows[a:b], query, out=out[a:b]))
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )
        return out


_SERIAL = Scanner(1)


@dataclass
class _Build:
    """A sketch being packed on the builder thread from `src[:n]`, read in place (no copy)."""

    kernel: Int8Kernel
    src: np.ndarray
    n: int
    ids: list[str]  # the snapshot: position -> entry id
    taken_at: int  # rows stamped after this are not in the snapshot (or not with their current vector)
    future: Future[tuple[list[Block], float]]
    touched: set[int] = field(default_factory=set)  # rows < n of src written while packing


class Partition:
    """Rows of one partition; removal swaps the last row into the hole so rows stay contiguous.

    Large partitions also keep an int8 sketch (cache_service/sketch.py) of a snapshot of their rows, rebuilt
    in the background. Every write stamps its row with a counter, so the rows a sketch lacks (or holds an
    older vector of) are those stamped after its snapshot; per row, `_spos` is the row's position in the
    installed sketch and `_ppos` in the snapshot being packed (both move with the row when a removal moves
    it).
    """

    def __init__(
        self, dim: int, scope: str, scanner: Scanner | None = None, builder: SketchBuilder | None = None
    ) -> None:
        self.scope = scope
        self._matrix = np.zeros((MIN_CAPACITY, dim), dtype=STORAGE_DTYPE)
        self._stamp = np.zeros(MIN_CAPACITY, dtype=np.int64)
        self._spos = np.zeros(MIN_CAPACITY, dtype=np.int64)
        self._ppos = np.zeros(MIN_CAPACITY, dtype=np.int64)
        self._clock = 0
        self._ids: list[str] = []
        self._queries: list[str] = []
        self._rows: dict[str, int] = {}
        self._scanner = scanner or _SERIAL
        self._builder = builder
        self._sketch: Sketch | None = None
        self._build: _Build | None = None
        self._next_build = 0.0  # time.monotonic() before which no build starts

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

    @property
    def sketch(self) -> Sketch | None:
        return self._sketch

    def close(self) -> None:
        """Forgets the sketch and any build in progress (its result is dropped)."""
        if self._build is not None:
            self._build.future.cancel()
        self._build = None
        self._sketch = None

    def add(self, entry_id: str, vector: np.ndarray, query: str) -> None:
        row = self._rows.get(entry_id)
        sk = self._sketch
        if row is None:
            row = len(self._ids)
            if row == self._matrix.shape[0]:
                self._resize(row * 2)
            self._ids.append(entry_id)
            self._queries.append(query)
            self._rows[entry_id] = row
            if sk is not None:
                sk.fresh += 1
        else:
            self._queries[row] = query
            if sk is not None and self._stamp[row] <= sk.taken_at:  # the sketch has its old vector
                sk.kill(int(self._spos[row]))
                sk.fresh += 1
        self._written(row)
        self._matrix[row] = vector  # rounded to nearest float16
        self._refresh()

    def remove(self, entry_id: str) -> bool:
        row = self._rows.pop(entry_id, None)
        if row is None:
            return False
        sk = self._sketch
        if sk is not None:
            if self._stamp[row] <= sk.taken_at:
                sk.kill(int(self._spos[row]))
            else:
                sk.fresh -= 1
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._touch(row)
            self._matrix[row] = self._matrix[last]
            for meta in (self._stamp, self._spos, self._ppos):
                meta[row] = meta[last]
            self._ids[row] = moved
            self._queries[row] = self._queries[last]
            self._rows[moved] = row
        self._ids.pop()
        self._queries.pop()
        if MIN_CAPACITY < self._matrix.shape[0] and len(self._ids) <= self._matrix.shape[0] // 4:
            self._resize(self._matrix.shape[0] // 2)  # growth doubles at full: no flapping
        self._refresh()
        return True

    def search(self, vector: np.ndarray, k: int, min_similarity: float) -> list[Candidate]:
        """The k most similar rows at or above min_similarity, best first; similarities in float32."""
        n = len(self._ids)
        if n == 0 or k <= 0:
            return []
        self._refresh()
        query = np.ascontiguousarray(vector, dtype=np.float32)
        q32 = torch.from_numpy(query)
        pool = max(RESCORE_ROWS, k)
        sk = self._sketch
        matrix = torch.from_numpy(self._matrix)
        if n <= pool:
            rows = np.arange(n)
        elif sk is not None and sk.fresh <= max(DELTA_MAX_MIN, n * DELTA_MAX_FRACTION):
            rows = self._sketch_candidates(sk, q32, max(SKETCH_CANDIDATES, k), pool)
        else:  # float16 scan, then the best `pool` rows (unordered)
            scores = self._scanner.mv(matrix[:n], q32.to(torch.float16))
            rows = torch.topk(scores, pool, sorted=False).indices.numpy()
        # Exact: float32(row) . query in float32 (torch: numpy's float16 -> float32 conversion is ~6x slower)
        exact = torch.mv(matrix.index_select(0, torch.from_numpy(rows)).float(), q32).numpy()
        best = np.argsort(-exact, kind="stable")[:k]
        return [
            Candidate(self._ids[i], self._queries[i], float(s))
            for i, s in zip(rows[best].tolist(), exact[best].tolist(), strict=True)
            if s >= min_similarity
        ]

    def settle(self, timeout: float | None = None, rebuild: bool = False) -> bool:
        """Waits for the build in progress (and any it makes due) and installs it; with `rebuild`, first
        starts one now, regardless of thresholds and pauses, unless the sketch covers every row. True if a
        sketch is in place. For tests and benchmarks: a lookup never waits for a build."""
        while True:
            self._refresh(force=rebuild)
            if self._build is None:
                return self._sketch is not None
            if not wait([self._build.future], timeout).done:
                raise TimeoutError("index sketch build still running")

    # -- sketch upkeep (all on the event-loop thread) --

    def _sketch_candidates(self, sk: Sketch, query: torch.Tensor, count: int, pool: int) -> np.ndarray:
        """Rows to re-score: the sketch's `count` best live positions, mapped by entry id to the current rows
        (entries removed since are skipped), and the `pool` best of the rows the sketch lacks (the fresh
        rows), picked by a float16 scan of those rows as in the plain float16 path."""
        scores = sk.scores(query[None, :], self._scanner)
        positions = torch.topk(scores, min(count, sk.n), sorted=False).indices.tolist()
        ids, rows_of = sk.ids, self._rows
        found = [rows_of.get(ids[p]) for p in positions]
        rows = np.fromiter((r for r in found if r is not None), dtype=np.int64)
        if sk.fresh:
            fresh = np.flatnonzero(self._stamp[: len(self._ids)] > sk.taken_at)
            if len(fresh) > pool:
                part = torch.from_numpy(self._matrix).index_select(0, torch.from_numpy(fresh))
                scores = torch.mv(part, query.to(torch.float16))
                fresh = fresh[torch.topk(scores, pool, sorted=False).indices.numpy()]
            rows = np.concatenate([rows, fresh])
        return np.unique(rows)  # a re-stored entry can be both

    def _resize(self, capacity: int) -> None:
        """New arrays of `capacity` rows (doubled when full, halved when a quarter full: a partition that
        once held a burst of entries gives the memory back as they expire)."""
        rows = min(self._matrix.shape[0], capacity)
        resized = np.zeros((capacity, self._matrix.shape[1]), dtype=STORAGE_DTYPE)
        resized[:rows] = self._matrix[:rows]
        self._matrix = resized  # a build in progress keeps reading the old array, which no longer changes
        for name in ("_stamp", "_spos", "_ppos"):
            meta = np.zeros(capacity, dtype=np.int64)
            meta[:rows] = getattr(self, name)[:rows]
            setattr(self, name, meta)

    def _written(self, row: int) -> None:
        """Before `row` gets a new vector (or a new entry)."""
        self._touch(row)
        self._clock += 1
        self._stamp[row] = self._clock

    def _touch(self, row: int) -> None:
        """Before `row` of the matrix is overwritten: if a build is reading that very array, its position
        `row` may hold the new contents (or a mix), so the build must not vouch for it (see _install)."""
        b = self._build
        if b is not None and row < b.n and self._matrix is b.src:
            b.touched.add(row)

    def _refresh(self, force: bool = False) -> None:
        """Installs a finished build; starts one when the partition needs it and the builder may (`force`:
        whenever the sketch misses a change)."""
        b = self._build
        if b is not None and b.future.done():
            self._install(b)
        n = len(self._ids)
        sk = self._sketch
        if n < (SKETCH_MIN_ROWS if sk is None else SKETCH_MIN_ROWS // 2):  # hysteresis: no flapping
            self._sketch = None
            return
        if self._build is not None or self._builder is None:
            return
        if sk is not None:
            allowed = 0 if force else max(REBUILD_MIN_CHANGES, sk.n * REBUILD_FRACTION)
            if sk.changes <= allowed:
                return
        if not force and time.monotonic() < self._next_build:
            return
        kernel = self._builder.kernel
        if kernel is None:  # no int8 kernel here (or the index is closed): float16 scans only
            self._builder = None
            return
        self._ppos[:n] = np.arange(n)
        future = self._builder.submit(kernel, self._matrix, n)
        self._build = _Build(kernel, self._matrix, n, list(self._ids), self._clock, future)

    def _install(self, b: _Build) -> None:
        self._build = None
        try:
            blocks, seconds = b.future.result()
        except CancelledError:  # the index was closed
            return
        except Exception:
            log.exception("index sketch build failed: float16 scans only for this partition")
            self._builder = None
            self._sketch = None
            return
        pause = (self._builder.gap if self._builder else 0.0) * seconds
        self._next_build = time.monotonic() + min(pause, MAX_BUILD_PAUSE)
        n = len(self._ids)
        if n < SKETCH_MIN_ROWS // 2:
            self._sketch = None
            return
        # Entries whose snapshot position was overwritten while packing: stamp them again, so they count
        # as rows the new sketch lacks (fresh: scanned from the float16 rows) and their positions as dead.
        for pos in b.touched:
            row = self._rows.get(b.ids[pos])
            if row is not None and self._stamp[row] <= b.taken_at:
                self._clock += 1
                self._stamp[row] = self._clock
        sk = Sketch(b.kernel, blocks, b.ids, b.taken_at)
        kept = np.flatnonzero(self._stamp[:n] <= b.taken_at)  # rows with the vector they had in the snapshot
        dead = np.ones(sk.n, dtype=bool)
        dead[self._ppos[kept]] = False
        sk.set_dead(dead)
        sk.fresh = n - len(kept)
        self._spos[:n] = self._ppos[:n]
        self._sketch = sk


class VectorIndex:
    """Partitions by key; `scan_threads` threads split each large scan (see Scanner). With `sketch` (the
    default), partitions of SKETCH_MIN_ROWS rows or more are prefiltered by an int8 sketch where this process
    has the int8 kernel (fbgemm), and scanned in float16 otherwise."""

    def __init__(self, dim: int, scan_threads: int = 1, sketch: bool = True) -> None:
        self.dim = dim
        self._scanner = Scanner(scan_threads)
        self._builder = SketchBuilder(groups=self._scanner.threads) if sketch else None
        self._partitions: dict[str, Partition] = {}
        self._owner: dict[str, str] = {}  # entry id -> partition
        # The canonical tier: (partition, canonical key) -> entry ids; entry id -> (its keys, its question)
        self._canonical: dict[tuple[str, bytes], set[str]] = {}
        self._canonical_of: dict[str, tuple[frozenset[bytes], str]] = {}
        self._exact_only: dict[str, str] = {}  # entry id -> scope of the entries without a row (add_exact)

    def __len__(self) -> int:
        return len(self._owner) + len(self._exact_only)

    @property
    def scan_threads(self) -> int:
        return self._scanner.threads

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._owner or entry_id in self._exact_only

    def close(self) -> None:
        if self._builder is not None:
            self._builder.close()
        for part in self._partitions.values():
            part.close()
        self._scanner.close()

    def settle(self, timeout: float | None = None, rebuild: bool = False) -> None:
        """Partition.settle on every partition (tests, benchmarks: lookups never wait for a build)."""
        for part in self._partitions.values():
            part.settle(timeout, rebuild)

    def sketch(self, partition: str) -> Sketch | None:
        part = self._partitions.get(partition)
        return part.sketch if part is not None else None

    def entry_ids(self) -> set[str]:
        return set(self._owner) | set(self._exact_only)

    def add(self, entry_id: str, partition: str, scope: str, vector: np.ndarray, query: str) -> None:
        question = Conversation.decode(query).question  # first: a failure here must leave no half entry
        keys = _digests(canonical_keys(question))
        self._exact_only.pop(entry_id, None)
        old = self._owner.get(entry_id)
        if old is not None and old != partition:
            self.remove(entry_id)
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = Partition(self.dim, scope, self._scanner, self._builder)
        part.add(entry_id, vector, query)
        self._owner[entry_id] = partition
        self._canonical_of[entry_id] = (keys, question)
        for key in keys:
            self._canonical.setdefault((partition, key), set()).add(entry_id)

    def add_exact(self, entry_id: str, scope: str) -> None:
        """An entry only the exact tier answers (cache_service/keys.py `exact_only`): no row, no canonical
        key, never searched; known by id for the resync, a scope's invalidation and the entry count."""
        self.remove(entry_id)
        self._exact_only[entry_id] = scope

    def remove(self, entry_id: str) -> bool:
        if self._exact_only.pop(entry_id, None) is not None:
            return True
        partition = self._owner.pop(entry_id, None)
        if partition is None:
            return False
        keys, _ = self._canonical_of.pop(entry_id)
        for key in keys:
            ids = self._canonical.get((partition, key))
            if ids is not None:
                ids.discard(entry_id)
                if not ids:
                    del self._canonical[(partition, key)]
        part = self._partitions[partition]
        part.remove(entry_id)
        if len(part) == 0:
            part.close()
            del self._partitions[partition]
        return True

    def canonical_matches(self, partition: str, keys: frozenset[str]) -> list[tuple[str, str]]:
        """(entry id, stored question) of the entries in `partition` sharing a canonical key with `keys`."""
        ids = sorted({i for key in _digests(keys) for i in self._canonical.get((partition, key), ())})
        return [(i, self._canonical_of[i][1]) for i in ids]

    def has_partition(self, partition: str) -> bool:
        return partition in self._partitions

    def ids_in_scope(self, scope: str) -> list[str]:
        exact_only = [i for i, s in self._exact_only.items() if s == scope]
        return [i for p in self._partitions.values() if p.scope == scope for i in p.ids] + exact_only

    def search(self, partition: str, vector: np.ndarray, k: int, min_similarity: float) -> list[Candidate]:
        part = self._partitions.get(partition)
        return part.search(vector, k, min_similarity) if part is not None else []


def _digests(keys: frozenset[str]) -> frozenset[bytes]:
    """Canonical keys held as 16-byte digests: a long message has up to ~30 keys of its whole text (clause
    and sentence orders), and the index keeps them for every entry."""
    return frozenset(hashlib.blake2b(key.encode(), digest_size=16).digest() for key in keys)
