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
# The sources compile as two translation units ("unity" builds, one per core of the small machines this
# runs on): torch's headers take ~6 of each file's ~9 s to parse, so ten files one by one spent most of a
# fresh clone's 63 s kernel build on them (two units: 16 s, AVX2 EPYC). Files in one unit share its anonymous
# namespace, so their private names must differ: the build fails on a redefinition if two collide (move
# one of the files to the other unit, or name the constant after its file, as bf16_weight_linear.cpp does).
UNITS = (
    (
        "int8_linear.cpp",
        "bf16_weight_linear.cpp",
        "w8a8_linear.cpp",
        "w4a8_linear.cpp",
        "decode_layers.cpp",
        "paged_attention.cpp",
    ),
    ("int4_linear.cpp", "amx_linear.cpp", "prefill_attention.cpp", "sampling.cpp", "fused_ops.cpp"),
)
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]


def unit_sources() -> list[Path]:
    """One generated file per unit that includes its sources, rewritten only when its text changes (a
    newer file would make ninja compile the unit again); the compiler's dependency files track the rest."""
    paths = []
    for i, unit in enumerate(UNITS):
        path = BUILD_DIR / f"unit_{i}.cpp"
        text = "".join(f'#include "{SOURCE_DIR / name}"\n' for name in unit)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        paths.append(path)
    return paths


def build(verbose: bool = False) -> Path:
    """Compile (or reuse an up-to-date build of) the extension; returns the shared library."""
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(exist_ok=True)
    load(
        name=MODULE_NAME,
        sources=[str(s) for s in unit_sources()],
        build_directory=str(BUILD_DIR),
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=verbose,
    )
    return BUILD_DIR / f"{MODULE_NAME}.so"
