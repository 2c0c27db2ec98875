"""Native CPU kernels of the engine, compiled on the machine that runs them.

`make kernels` (a dependency of `make run` and `make test`) builds them into `worker/kernels/build/` with
torch's extension builder; `-march=native` is right because the build runs where the worker runs (the
Docker image builds them in its own build step). A worker without the compiled kernels still runs, on the
torch gather path, and says so at start. Loading is in common/native_kernels.py, so the cache service's
embedder finds the same library without importing the worker.
"""

from __future__ import annotations

from pathlib import Path

from common.native_kernels import LIBRARY_DIR as BUILD_DIR
from common.native_kernels import LIBRARY_NAME as MODULE_NAME
from common.native_kernels import native_op, native_ops

__all__ = ["build", "native_op", "native_ops"]

SOURCE_DIR = Path(__file__).parent
SOURCES = [
    SOURCE_DIR / "paged_attention.cpp",
    SOURCE_DIR / "fused_ops.cpp",
    SOURCE_DIR / "int8_linear.cpp",
    SOURCE_DIR / "int4_linear.cpp",
    SOURCE_DIR / "bf16_weight_linear.cpp",
    SOURCE_DIR / "decode_layers.cpp",
    SOURCE_DIR / "sampling.cpp",
    SOURCE_DIR / "amx_linear.cpp",
    SOURCE_DIR / "w8a8_linear.cpp",
    SOURCE_DIR / "prefill_attention.cpp",
]
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]


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
