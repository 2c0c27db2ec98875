"""CPU memory the kernels stream through, backed by 2 MB pages where Linux allows it.

A decode step reads every weight and every sequence's K/V rows once. With 4 KB pages that is a TLB miss
every 4 KB of weights and one for nearly every 2 KB block of the paged KV pool (blocks lie anywhere in a
pool of tens of MB); Linux's transparent huge pages are commonly on only where a program asks for them
(`madvise` mode, the Debian and Ubuntu default). Asked for here (docs/BENCHMARKS.md, engine notes; AMX Xeon,
2 cores, in process, interleaved): SmolLM2's linears at one row 8.0 -> 6.6 ms a step, at 64 rows 13.5 ->
13.0; decode attention of 64 sequences of ~190 tokens 15.8 -> 14.0 ms a step.

Memory is asked for before it is first written (the kernel backs a region with huge pages as it faults it
in), and aligned to 2 MB. Weights are small (a few MB each), so they are packed side by side into
`PageArena` chunks rather than each in its own aligned region. Where the advice is refused (another OS, THP
off) the memory is plain memory: nothing else changes. `set_enabled(False)` (the worker's
`WORKER_HUGE_PAGES=false`) never asks: to compare, or where an operator keeps huge pages off a host.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
ARENA_CHUNK = 64 << 20  # bytes per arena chunk: a few layers' weights


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_enabled = True


def set_enabled(enabled: bool) -> None:
    """Whether memory allocated from now on is advised as huge pages (on by default)."""
    global _enabled
    _enabled = enabled


def _aligned_bytes(nbytes: int) -> torch.Tensor:
    """`nbytes` fresh bytes (never written yet), starting on a 2 MB boundary, advised as huge pages."""
    rounded = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    raw = torch.empty(rounded + HUGE_PAGE, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE_PAGE
    madvise = _madvise() if _enabled else None
    if madvise is not None:
        madvise(raw.data_ptr() + start, rounded, MADV_HUGEPAGE)  # refused: plain pages, same memory
    return raw[start : start + nbytes]  # a view: keeps `raw` alive


def huge_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor of its own, on huge pages where the OS allows (the KV pool of one layer)."""
    nbytes = math.prod(shape) * dtype.itemsize
    return _aligned_bytes(nbytes).view(dtype).view(shape).zero_()


class PageArena:
    """Tensors packed side by side into 2 MB-aligned chunks advised as huge pages; each tensor is a view of
    its chunk (a chunk lives as long as any of its tensors). Each start is 64-byte aligned."""

    def __init__(self, chunk_bytes: int = ARENA_CHUNK) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes >= self.chunk_bytes // 2:  # a large tensor gets a region of its own
            return _aligned_bytes(nbytes).view(dtype).view(shape)
        start = -(-self._used // 64) * 64
        if self._chunk is None or start + nbytes > self._chunk.numel():
            self._chunk, start = _aligned_bytes(self.chunk_bytes), 0
        self._used = start + nbytes
        return self._chunk[start : start + nbytes].view(dtype).view(shape)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of a CPU tensor in the arena."""
        out = self.empty(tuple(tensor.shape), tensor.dtype)
        out.copy_(tensor)
        return out


# The weights of every layer built in this process (the worker's model, the cache service's embedder).
WEIGHTS = PageArena()
