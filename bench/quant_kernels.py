"""Torch's weight-only int8/int4 CPU kernels against the engine's prepacked oneDNN `Linear`, at the model's
shapes and the batch sizes the engine runs (1, 8, 32 rows), in bfloat16 and float32 inputs, side by side.

Why it exists: it chose services/quant.py's design (kernels fed bfloat16; groups of 32). Medians of
interleaved repetitions, microseconds per call.

    .venv/bin/python -m bench.quant_kernels [--threads 2] [--write-docs]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from bench.report import median, write_section
from services.linear import Linear
from services.quant import Int4Groups, Int4Linear, Int8Linear

SHAPES = {
    "qkv": (960, 576),
    "o_proj": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}
ROWS = (1, 8, 32)


def time_us(fns: dict[str, callable], reps: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: median(t) * 1e6 for name, t in times.items()}


def int4_with_float32_inputs(weight: torch.Tensor) -> callable:
    """The same kernel fed float32 (its scalar fallback on AVX2), for the table's last column."""
    layer = Int4Linear(weight, groups=Int4Groups.from_float(weight))
    pairs = layer.scales_and_offsets.float()
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.weight, layer.group_size, pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lines = [
        "## Quantized linear kernels (bench/quant_kernels.py)",
        "",
        f"Command: `python -m bench.quant_kernels --threads {args.threads}`; CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}; median microseconds per call, interleaved.",
        "",
        "| shape (out x in) | rows | oneDNN fp32 | oneDNN bf16 | int8 (bf16 in) | int4 g32 (bf16 in) "
        "| int4 g32 (fp32 in) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k) * 0.05
        dense32, dense16 = Linear(weight), Linear(weight.bfloat16())
        int8, int4 = Int8Linear(weight.bfloat16()), Int4Linear(weight.bfloat16())
        int4_fp32 = int4_with_float32_inputs(weight)
        for rows in ROWS:
            x32 = torch.randn(rows, k)
            x16 = x32.bfloat16()
            fns = {
                "fp32": partial(dense32, x32),
                "bf16": partial(dense16, x16),
                "int8": partial(int8, x16),
                "int4": partial(int4, x16),
            }
            if name != "lm_head":  # the scalar fallback takes seconds on the head
                fns["int4_fp32"] = partial(int4_fp32, x32)
            reps = 9 if name == "lm_head" else 31
            t = time_us(fns, reps)
            cells = [
                f"{t[c]:.0f}" if c in t else "n/a" for c in ("fp32", "bf16", "int8", "int4", "int4_fp32")
            ]
            lines.append(f"| {name} {n}x{k} | {rows} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    body = "\n".join(lines)
    if args.write_docs:
        write_section("quant-kernels", body)


if __name__ == "__main__":
    main()
