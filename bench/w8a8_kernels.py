"""The linears of a decode step with int8 weights x int8 rows (`WORKER_QUANTIZATION=w8a8`) beside bfloat16
weights, at the row counts of decode batches.

Columns (each one call per linear, as the engine makes them):
  bf16          bfloat16 weights on the engine's `Linear` (the project's AMX tile kernel where AMX exists,
                else oneDNN's prepacked GEMM): what `WORKER_QUANTIZATION=none` runs
  w8a8          worker/kernels/w8a8_linear.cpp (AVX512-VNNI): what a w8a8 layer runs
Every row is the 30 decoder layers' four linears at SmolLM2-135M's shapes with distinct weights (100 MB of
int8 codes, 200 MB of bfloat16), so the weights stream from memory as in a served step; a single layer
timed alone sits in cache and says little. Milliseconds per pass; the columns take turns within each
repetition; minimum and median of the repetitions.

    .venv/bin/python -m bench.w8a8_kernels [--rows 1,2,4,8,16,32,64,128] [--reps 9] [--write-docs]
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
from worker.model.w8a8 import W8A8Linear

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # qkv, o_proj, gate_up, down: (out, in)
NUM_LAYERS = 30


def stack() -> list[tuple[Linear, W8A8Linear]]:
    """Per linear of the 30 layers: bfloat16, and w8a8 on the project's GEMM."""
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(NUM_LAYERS):
        for out_features, in_features in SHAPES:
            weight = torch.randn(out_features, in_features, generator=gen) * 0.02
            layers.append((Linear(weight.bfloat16(), None, "auto"), W8A8Linear(weight)))
    return layers


def columns(layers: list, rows: int) -> dict[str, Callable[[], None]]:
    xs = {k: torch.randn(rows, k, generator=torch.Generator().manual_seed(k)).bfloat16() for _, k in SHAPES}
    outs = {n: torch.empty(rows, n, dtype=torch.bfloat16) for n, _ in SHAPES}
    ops = native_ops()

    def w8a8() -> None:
        for _, layer in layers:
            x, out = xs[layer.in_features], outs[layer.out_features]
            ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, out)

    return {"bf16": lambda: [bf16(xs[layer.in_features]) for bf16, layer in layers], "w8a8": w8a8}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    ops = native_ops()
    if ops is None or not hasattr(ops, "w8a8_linear_supported"):
        raise SystemExit("the native kernels are not built: make kernels")
    if not ops.w8a8_linear_supported():
        raise SystemExit("no integer GEMM on this CPU or build (w8a8 needs AVX512-VNNI)")
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
        "weights, ms per pass, minimum / median of the repetitions (columns in turn). bf16: bfloat16 "
        "weights on the engine's `Linear`; w8a8: worker/kernels/w8a8_linear.cpp, what a w8a8 layer runs. The "
        "module docstring has the details; the served comparison is bench.peer_bench's.",
        "",
        "| rows | " + " | ".join(names) + " | bf16 / w8a8 (minima) |",
        "|---" * (len(names) + 2) + "|",
    ]
    for rows, cells in table.items():
        ratio = f"{cells['bf16'][0] / cells['w8a8'][0]:.2f}x"
        row_cells = " | ".join(f"{lo:.2f} / {mid:.2f}" for lo, mid in cells.values())
        lines.append(f"| {rows} | {row_cells} | {ratio} |")
    publish(cpu_section("w8a8-kernels", cpu.kind), lines, args.write_docs)


if __name__ == "__main__":
    main()
