"""The project's compiled CPU kernels, found by path rather than imported: the worker builds them
(worker/kernels, `make kernels`), and any process that finds the shared library loads its ops into
`torch.ops.llmserve`. Absent, every caller falls back to torch ops.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

LIBRARY_NAME = "llmserve_paged_attention"
LIBRARY_DIR = Path(__file__).resolve().parents[1] / "worker" / "kernels" / "build"
LIBRARY = LIBRARY_DIR / f"{LIBRARY_NAME}.so"

_loaded: object | None = None
_tried = False


def native_ops() -> object | None:
    """`torch.ops.llmserve` once the compiled library is loaded, or None when it has not been built."""
    global _loaded, _tried
    if not _tried:
        _tried = True
        if LIBRARY.exists():
            import torch

            torch.ops.load_library(str(LIBRARY))
            _loaded = torch.ops.llmserve
        else:
            log.warning("native kernels not built (run `make kernels`): running on torch ops only")
    return _loaded


def native_op(name: str) -> object | None:
    """`torch.ops.llmserve` when the compiled kernels are loaded and have `name` (a build from before that
    kernel existed does not), else None."""
    ops = native_ops()
    return ops if ops is not None and hasattr(ops, name) else None
