"""The linears of a decode step with integer rows (`WORKER_QUANTIZATION=w8a8`, and `w4a8` where built) beside
unquantized and int8 weight-only ones, at the row counts of decode batches and prefill chunks.

Columns (each one call per linear, as the engine makes them):
  bf16 / fp32   unquantized weights on the engine's `Linear` in the dtype this CPU computes natively (bfloat16
                where oneDNN has it: the project's AMX tile kernel where AMX exists, else oneDNN's prepacked
                GEMM; float32 elsewhere): what `WORKER_QUANTIZATION=none` runs
  int8          int8 weights, float32 rows (worker/kernels/int8_linear.cpp): `WORKER_QUANTIZATION=int8`
  w8a8          worker/kernels/w8a8_linear.cpp (AVX512-VNNI, or VPMADDUBSW on 7-bit rows on AVX2): what a
                w8a8 layer runs
  w4a8          worker/kernels/w4a8_linear.cpp (AVX512-VNNI, or AVX2): 4-bit weights (Q4_1 groups) x 8-bit
                rows, what a w4a8 layer runs (where the build has it)
Every row is the 30 decoder layers' four linears at SmolLM2-135M's shapes with distinct weights (100 MB of
int8 codes, 66 MB of 4-bit ones with their float16 scales and mins, 200 MB of bfloat16, 400 MB of float32),
so the weights stream from memory as in a served step; a
single layer timed alone sits in cache and says little. Milliseconds per pass; the columns take turns within
each repetition; minimum and median of the repetitions.

    .venv/bin/python -m bench.w8a8_kernels [--rows 1,2,4,8,16,32,64,128,256] [--reps 9] [--write-docs]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from bench.report import cpu_section, median, publish
from common.linear import Linear
from worker.kernels import native_ops
from worker.model.cpu_kind import cpu_info
from worker.model.quant import Int8Linear, native_cpu_bfloat16
from worker.model.w4a8 import W4A8Linear, w4a8_available
from worker.model.w8a8 import W8A8Linear

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # qkv, o_proj, gate_up, down: (out, in)
NUM_LAYERS = 30


BASE = "bf16" if native_cpu_bfloat16() else "fp32"  # the unquantized column's dtype on this CPU
BASE_DTYPE = torch.bfloat16 if BASE == "bf16" else torch.float32


def stack() -> list[tuple[Linear, Int8Linear, W8A8Linear, W4A8Linear | None]]:
    """Per linear of the 30 layers: unquantized (BASE), int8 weight-only, w8a8 on the project's GEMM, and w4a8
    where the build has its kernel."""
    with_w4a8 = w4a8_available(torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(NUM_LAYERS):
        for out_features, in_features in SHAPES:
            weight = torch.randn(out_features, in_features, generator=gen) * 0.02
            unquantized = Linear(weight.to(BASE_DTYPE), None, "auto")
            w4a8 = W4A8Linear(weight) if with_w4a8 else None
            layers.append((unquantized, Int8Linear(weight), W8A8Linear(weight), w4a8))
    return layers


def columns(layers: list, rows: int) -> dict[str, Callable[[], None]]:
    xs = {
        k: torch.randn(rows, k, generator=torch.Generator().manual_seed(k)).to(BASE_DTYPE) for _, k in SHAPES
    }
    outs = {n: torch.empty(rows, n, dtype=BASE_DTYPE) for n, _ in SHAPES}
    ops = native_ops()

    def w8a8() -> None:
        for _, _, layer, _ in layers:
            x, out = xs[layer.in_features], outs[layer.out_features]
            ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, out)

    def w4a8() -> None:
        for _, _, _, layer in layers:
            x, out = xs[layer.in_features], outs[layer.out_features]
            ops.w4a8_linear(x, layer.weight, layer.scales_mins, out)

    fns = {
        BASE: lambda: [base(xs[layer.in_features]) for base, _, layer, _ in layers],
        "int8": lambda: [int8(xs[layer.in_features]) for _, int8, layer, _ in layers],
        "w8a8": w8a8,
    }
    if layers[0][3] is not None:
        fns["w4a8"] = w4a8
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    ops = native_ops()
    if ops is None or not hasattr(ops, "w8a8_linear_supported"):
        raise SystemExit("the native kernels are not built: make kernels")
    if not ops.w8a8_linear_supported():
        raise SystemExit("no integer GEMM on this CPU or build (w8a8 needs AVX512-VNNI or AVX2)")
    cpu = cpu_info()
    layers = stack()
    print(f"CPU: {cpu.describe()}; {torch.get_num_threads()} threads")
    table: dict[int, dict[str, tuple[float, float]]] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        fns = columns(layers, rows)
        for fn in fns.values():  # warm: oneDNN's primitives, the weights' first touch
            fn()
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.reps):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
        table[rows] = {name: (min(t), median(t)) for name, t in times.items()}
        print(rows, {name: f"{lo:.2f}/{mid:.2f}" for name, (lo, mid) in table[rows].items()}, flush=True)
    names = list(next(iter(table.values())))
    lines = [
        f"## w8a8 linears of a decode step, CPU kind {cpu.kind}",
        "",
        f"CPU: {cpu.describe()}, {torch.get_num_threads()} threads. Command: `python -m bench.w8a8_kernels "
        f"--rows {args.rows} --reps {args.reps}`. The 120 decoder linears of SmolLM2-135M with distinct "
        f"weights, ms per pass, minimum / median of the repetitions (columns in turn). {BASE}: unquantized "
        "weights on the engine's `Linear` in this CPU's native dtype; int8: int8 weights, float32 rows; "
        "w8a8: worker/kernels/w8a8_linear.cpp, what a w8a8 layer runs; w4a8 (where built): "
        "worker/kernels/w4a8_linear.cpp, 4-bit weights x 8-bit rows. The module docstring has the details; "
        "the served comparison is bench.peer_bench's.",
        "",
        "| rows | "
        + " | ".join(names)
        + f" | {BASE} / w8a8 | int8 / w8a8"
        + (" | w8a8 / w4a8" if "w4a8" in names else "")
        + " (minima) |",
        "|---" * (len(names) + 3 + ("w4a8" in names)) + "|",
    ]
    for rows, cells in table.items():
        pairs = [(BASE, "w8a8"), ("int8", "w8a8")] + ([("w8a8", "w4a8")] if "w4a8" in names else [])
        ratios = " | ".join(f"{cells[a][0] / cells[b][0]:.2f}x" for a, b in pairs)
        row_cells = " | ".join(f"{lo:.2f} / {mid:.2f}" for lo, mid in cells.values())
        lines.append(f"| {rows} | {row_cells} | {ratios} |")
    publish(cpu_section("w8a8-kernels", cpu.kind), lines, args.write_docs)


if __name__ == "__main__":
    main()
