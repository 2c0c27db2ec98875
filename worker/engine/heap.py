"""Hands freed heap memory back to the OS now and then.

Every step allocates activations, logits and small tensors whose sizes change with the batch. glibc
keeps what they free in its arenas, fragmented, so a worker under steady load grows although nothing is
leaked, until `malloc_trim(0)` hands it back (docs/STUDY_LOG.md). Trimming costs a few milliseconds, so
the engine thread does it at most every `interval_s`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time


class HeapTrimmer:
    def __init__(self, interval_s: float = 30.0) -> None:
        self.interval_s = interval_s
        self._last = time.monotonic()
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
        self._trim = getattr(libc, "malloc_trim", None)  # glibc only; elsewhere a no-op

    def maybe_trim(self) -> bool:
        """Trim if the interval has passed; returns whether it did."""
        now = time.monotonic()
        if self._trim is None or now - self._last < self.interval_s:
            return False
        self._last = now
        self._trim(0)
        return True
