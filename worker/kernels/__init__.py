"""Native CPU kernels of the engine, compiled on the machine that runs them.

`make kernels` (a dependency of `make run` and `make test`) builds them into `worker/kernels/build/` with
torch's extension builder; `-march=native` is right because the build runs where the worker runs (the
Docker image builds them in its own build step). A worker without the compiled kernels still runs, on the
torch gather path, and says so at start.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent
BUILD_DIR = SOURCE_DIR / "build"
MODULE_NAME = "llmserve_paged_attention"
SOURCES = [
    SOURCE_DIR / "paged_attention.cpp",
    SOURCE_DIR / "fused_ops.cpp",
    SOURCE_DIR / "int8_linear.cpp",
    SOURCE_DIR / "int4_linear.cpp",
    SOURCE_DIR / "bf16_weight_linear.cpp",
    SOURCE_DIR / "decode_layers.cpp",
]
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]

_loaded: object | None = None
_tried = False


def build(verbose: bool = False) -> Path:
    """Compile (or reuse an up-to-date build of) the extension; returns the shared library."""
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(exist_ok=True)
    load(
        name=MODULE_NAME,
        sources=[str(s) for s in SOURCES],
        build_directory=str(BUILD_DIR),
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=verbose,
    )
    return BUILD_DIR / f"{MODULE_NAME}.so"


def native_ops() -> object | None:
    """`torch.ops.llmserve` once the compiled library is loaded, or None when it has not been built."""
    global _loaded, _tried
    if not _tried:
        _tried = True
        library = BUILD_DIR / f"{MODULE_NAME}.so"
        if library.exists():
            import torch

            torch.ops.load_library(str(library))
            _loaded = torch.ops.llmserve
        else:
            log.warning("native kernels not built (run `make kernels`): the engine runs on torch ops only")
    return _loaded


def native_op(name: str) -> object | None:
    """`torch.ops.llmserve` when the compiled kernels are loaded and have `name` (a build from before that
    kernel existed does not), else None."""
    ops = native_ops()
    return ops if ops is not None and hasattr(ops, name) else None
