"""Int8 "sketch" of a partition's float16 rows: a cheap prefilter for the index's search (see index.py).

A sketch is a snapshot: the rows as they were when it was taken, quantized per row to int8 (symmetric, scale
= max |component| / 127) and prepacked for fbgemm, plus the snapshot's position -> entry id list. A scan is
`quantized::linear_dynamic` of the float32 query (quantized on the fly to 8 bits, per tensor) against the
packed rows: int8 x uint8 products accumulated in int32, half the bytes of the float16 scan (38 MB instead of
77 MB at 100k x 384) and about a third of its single-thread time. Its scores are only used to pick candidates;
the index re-scores those exactly from its float16 rows.

Everything here that touches a sketch's contents runs on the event-loop thread, except `pack_rows`, which runs
on the builder's own thread and reads only the rows it is given (see Partition in index.py for how writes
to those rows during a build are accounted for).
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

log = logging.getLogger(__name__)

SKETCH_MIN_ROWS = 4096  # smaller partitions are scanned in float16 (a sketch is dropped below half of this)
SKETCH_CANDIDATES = 64  # positions taken from a sketch scan (k if larger), then re-scored exactly
SKETCH_SPLIT_MIN_ROWS = 32768  # below, one thread scans the sketch (a helper costs more than it saves)
BLOCK_ROWS = 32768  # rows per packed block, at most (bounds the float32 copy made while packing)
REBUILD_FRACTION = 1 / 64  # rebuild when the changes since the snapshot exceed this share of it...
REBUILD_MIN_CHANGES = 256  # ...and this many (changes: rows written since, and entries removed since)
DELTA_MAX_FRACTION = 1 / 16  # search through the sketch only while the rows it lacks are at most this share
DELTA_MAX_MIN = 512  # (or this many): beyond, the float16 scan of the whole partition is as cheap
BUILD_GAP = 3.0  # after a build of t seconds, the partition's next build waits 3t: builder busy <= 25%...
MAX_BUILD_PAUSE = 30.0  # ...but at most this (t is wall time: long on a machine busy with other work)


T = TypeVar("T")


class Runner(Protocol):
    def parts(self, n: int) -> int: ...

    def run(self, tasks: list[Callable[[], T]]) -> list[T]: ...


@dataclass(frozen=True)
class Int8Kernel:
    """fbgemm's dynamic int8 linear; reduce_range: 7-bit activations, needed where the CPU's u8 x s8 pair
    products saturate int16 (AVX2 without VNNI), so that no product sum can overflow."""

    reduce_range: bool

    def pack(self, rows: torch.Tensor) -> Any:
        """float32 rows -> fbgemm's packed int8 weights (per-row symmetric scales)."""
        scales = rows.abs().amax(dim=1).clamp_min(1e-12).double() / 127.0
        zero = torch.zeros(rows.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(rows, scales, zero, axis=0, dtype=torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None)

    def scan(self, query: torch.Tensor, packed: Any) -> torch.Tensor:
        """query: float32 (1, dim) -> (1, rows) float32 approximate dot products."""
        return torch.ops.quantized.linear_dynamic(query, packed, self.reduce_range)


DEPRECATION = r"torch\.quantize_per_tensor, torch\.quantize_per_channel"  # start of torch's warning
_kernel_lock = threading.Lock()
_kernel: list[Int8Kernel | None] = []  # empty: not probed yet


def _probe() -> Int8Kernel | None:
    if torch.backends.quantized.engine not in ("fbgemm", "x86"):
        return None  # qnnpack (ARM) or none: the float16 scan stays
    dim = 64
    rows = torch.zeros(4, dim)
    rows[0, 0] = rows[0, 1] = 1.0  # with the query below: both u8 x s8 pair products at their maximum
    rows[1] = torch.linspace(-1.0, 1.0, dim)
    rows[2, 5] = -1.0
    rows[3] = 0.125
    query = torch.full((1, dim), -0.01)
    query[0, 0] = query[0, 1] = 1.0
    want = query @ rows.T
    for reduce_range in (False, True):
        kernel = Int8Kernel(reduce_range)
        got = kernel.scan(query, kernel.pack(rows))
        if torch.allclose(got, want, atol=0.05):
            return kernel
    return None


def int8_kernel() -> Int8Kernel | None:
    """The int8 scan this process can use, or None (no fbgemm, or its results are off): probed once."""
    with _kernel_lock:
        if not _kernel:
            try:
                with warnings.catch_warnings():  # torch's one warning per process: qint8 tensors deprecated
                    warnings.filterwarnings("ignore", DEPRECATION)
                    _kernel.append(_probe())
            except Exception as exc:  # torch built without quantized ops, unsupported CPU, ...
                log.info("int8 index sketch unavailable (%s): float16 scans only", exc)
                _kernel.append(None)
            else:
                if _kernel[0] is None:
                    log.info("int8 index sketch unavailable on this CPU/engine: float16 scans only")
        return _kernel[0]


@dataclass(frozen=True)
class Block:
    start: int
    stop: int
    packed: Any


def block_bounds(n: int, groups: int) -> list[int]:
    """Block boundaries: a multiple of `groups` blocks of near-equal size, none over BLOCK_ROWS."""
    groups = max(1, groups)
    count = groups * -(-n // (groups * BLOCK_ROWS))
    return [n * i // count for i in range(count + 1)]


def pack_rows(kernel: Int8Kernel, src: np.ndarray, n: int, groups: int) -> tuple[list[Block], float]:
    """Quantizes and packs src[:n] block by block (builder thread); returns the blocks and the seconds
    taken."""
    started = time.perf_counter()
    bounds = block_bounds(n, groups)
    blocks = [
        Block(a, b, kernel.pack(torch.from_numpy(src[a:b]).float()))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return blocks, time.perf_counter() - started


class Sketch:
    """An installed sketch and what changed since its snapshot (kept by the partition, event-loop thread):
    `dead` marks positions whose entry was removed or re-stored since (masked out of scans), `fresh` counts
    the partition's rows that the snapshot lacks or holds an older vector of (scanned in float16 instead)."""

    def __init__(self, kernel: Int8Kernel, blocks: list[Block], ids: list[str], taken_at: int) -> None:
        self.kernel = kernel
        self.blocks = blocks
        self.ids = ids
        self.n = len(ids)
        self.taken_at = taken_at
        self.dead = np.zeros(self.n, dtype=bool)
        self.dead_count = 0
        self.fresh = 0
        self._dead_at: torch.Tensor | None = None  # positions of `dead`, made again after a change

    @property
    def changes(self) -> int:
        return self.dead_count + self.fresh

    def kill(self, position: int) -> None:
        if not self.dead[position]:
            self.dead[position] = True
            self.dead_count += 1
            self._dead_at = None

    def set_dead(self, dead: np.ndarray) -> None:
        self.dead[:] = dead
        self.dead_count = int(dead.sum())
        self._dead_at = None

    def scores(self, query: torch.Tensor, runner: Runner) -> torch.Tensor:
        """Approximate scores of all snapshot positions, dead ones -inf; the blocks are scanned in groups, one
        per thread of `runner` (see Scanner)."""
        groups = _groups(self.blocks, runner.parts(self.n) if self.n >= SKETCH_SPLIT_MIN_ROWS else 1)
        parts = runner.run([(lambda g=g: [self.kernel.scan(query, b.packed) for b in g]) for g in groups])
        out = torch.cat([t.view(-1) for part in parts for t in part])
        if self.dead_count:
            if self._dead_at is None:
                self._dead_at = torch.from_numpy(np.flatnonzero(self.dead))
            out.index_fill_(0, self._dead_at, float("-inf"))
        return out


def _groups(blocks: list[Block], parts: int) -> list[list[Block]]:
    parts = max(1, min(parts, len(blocks)))
    bounds = [len(blocks) * i // parts for i in range(parts + 1)]
    return [blocks[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class SketchBuilder:
    """One background thread that packs sketches, one at a time, for all partitions of an index."""

    def __init__(self, groups: int = 1, gap: float = BUILD_GAP) -> None:
        self.groups = groups  # blocks are made a multiple of this (the scan's thread count)
        self.gap = gap
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    @property
    def kernel(self) -> Int8Kernel | None:
        return None if self._closed else int8_kernel()

    def submit(self, kernel: Int8Kernel, src: np.ndarray, n: int) -> Future[tuple[list[Block], float]]:
        if self._pool is None:
            # Normal priority on purpose. At SCHED_IDLE (or nice 19) lookups during a build were faster at
            # the median but 1-2% of them took 4-6 ms (one 20 ms), likely waiting for the GIL while the
            # preempted builder held it between two torch calls; at normal priority: ~2.2 ms p50, ~3 ms p99.
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sketch")
        return self._pool.submit(self.pack, kernel, src, n)

    def pack(self, kernel: Int8Kernel, src: np.ndarray, n: int) -> tuple[list[Block], float]:
        return pack_rows(kernel, src, n, self.groups)

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
