"""Weight-only int8/int4 linear kernels against the engine's prepacked oneDNN `Linear`, at the model's shapes
and the batch sizes the engine runs, side by side.

Columns: oneDNN float32 and bfloat16; the native int8 kernel (worker/kernels/int8_linear.cpp, float32 in);
the native 4-bit kernel (int4_linear.cpp, float32 in), each held on one of the paths the engine switches
between by rows: row-at-a-time products ("rows"; for int4 on a build without AVX512-BF16, from 5 rows its
float32 panel), the bfloat16 panel GEMM ("panel", bf16_panel_gemm.h; AVX512-BF16 builds) and dequantize +
oneDNN bfloat16 GEMM ("dequantized", worker/model/quant.py; CPUs with native bfloat16); torch's
`_weight_int4pack_mm_for_cpu` fed bfloat16 (its only vectorized input on AVX2) and fed float32 (its scalar
fallback). Each shape is timed alone (its weights stay in the last-level cache) and, in the `stack` rows, as
the 30 layers of a decode step with distinct weights (streamed from memory, as in the engine). Minimum and
median of interleaved repetitions, microseconds per call; on a shared machine only the minimum is worth
comparing.

Why it exists: it chose worker/model/quant.py's design (native kernels on CPU; torch's kernels fed bfloat16;
groups of 32; the row count from which to dequantize).

    .venv/bin/python -m bench.quant_kernels [--threads 2] [--rows 1,4,8,32] [--reps 15] [--write-docs]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from bench.report import cpu_section, median, write_section
from common.linear import Linear
from worker.kernels import native_ops
from worker.model.cpu_kind import cpu_info
from worker.model.quant import Int4Groups, Int4Linear, Int8Linear, native_cpu_bfloat16

SHAPES = {
    "qkv": (960, 576),
    "o_proj": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}
LAYER_SHAPES = ("qkv", "o_proj", "gate_up", "down")  # one decoder layer, for the stack rows
NUM_LAYERS = 30
_ops = native_ops()
if _ops is None:
    raise SystemExit("the native kernels are not built: make kernels")
PANEL_ROWS = _ops.bf16_panel_min_rows()  # the engine's switch, restored at the end; 0: no panel GEMM
COLUMNS = (
    "fp32",
    "bf16",
    "int8_rows",
    "int8_panel",
    "int8_deq",
    "int4_rows",
    "int4_panel",
    "int4_deq",
    "int4pack",
    "int4pack_fp32",
)
HEADERS = (
    "oneDNN fp32",
    "oneDNN bf16",
    "int8 rows",
    "int8 panel",
    "int8 dequantized",
    "int4 rows",
    "int4 panel",
    "int4 dequantized",
    "int4pack (bf16 in)",
    "int4pack (fp32 in)",
)


def time_us(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, tuple[float, float]]:
    """(min, median) microseconds per call of each function, repetitions interleaved."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (min(t) * 1e6, median(t) * 1e6) for name, t in times.items()}


def int4pack_layer(weight: torch.Tensor, groups: Int4Groups, dtype: torch.dtype) -> Callable:
    """torch's int4 kernel over the same groups, fed `dtype` rows (what Int4Linear runs without the native
    kernel is the bfloat16 one)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes.to(torch.int32), 1)
    pairs = torch.stack([groups.scales, groups.mins + 8 * groups.scales], -1).transpose(0, 1)
    pairs = pairs.to(dtype).contiguous()
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(dtype), packed, groups.group_size, pairs)


def held(layer: Int8Linear | Int4Linear, path: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The layer held on one path at every row count, where the engine switches by rows: the native kernel's
    row-at-a-time products ("rows"), its bfloat16 panel GEMM ("panel", from `bf16_panel_min_rows`), or
    dequantize + oneDNN bfloat16 GEMM ("deq", from `worker.model.quant.dequantize_min_rows`)."""
    layer.dequantize_from = 1 if path == "deq" else None
    ops = native_ops()
    panel_rows = {"rows": 10**9, "panel": 1}.get(path)

    def call(x: torch.Tensor) -> torch.Tensor:
        if panel_rows is not None:
            ops.set_bf16_panel_min_rows(panel_rows)
        return layer(x)

    return call


def layers_for(weight: torch.Tensor, with_fp32_fallback: bool) -> dict[str, Callable]:
    groups = Int4Groups.from_float(weight)
    layers = {
        "fp32": Linear(weight),
        "bf16": Linear(weight.bfloat16()),  # fed bfloat16 rows (`inputs`)
        "int8_rows": held(Int8Linear(weight), "rows"),
        "int4_rows": held(Int4Linear(weight, groups=groups), "rows"),
        "int4pack": int4pack_layer(weight, groups, torch.bfloat16),
    }
    if PANEL_ROWS:  # AVX512-BF16 builds
        layers["int8_panel"] = held(Int8Linear(weight), "panel")
        layers["int4_panel"] = held(Int4Linear(weight, groups=groups), "panel")
    if native_cpu_bfloat16():  # elsewhere bfloat16 GEMMs are emulated and the engine never dequantizes
        layers["int8_deq"] = held(Int8Linear(weight), "deq")
        layers["int4_deq"] = held(Int4Linear(weight, groups=groups), "deq")
    if with_fp32_fallback:
        layers["int4pack_fp32"] = int4pack_layer(weight, groups, torch.float32)
    return layers


def inputs(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each column's rows: bfloat16 for the bfloat16 layer, float32 for the rest (what a float32 model feeds;
    int4pack converts inside, as Int4Linear does without the native kernel)."""
    return {c: x.bfloat16() if c == "bf16" else x for c in COLUMNS}


def cells(t: dict[str, tuple[float, float]]) -> str:
    return " | ".join(f"{t[c][0]:.0f} / {t[c][1]:.0f}" if c in t else "n/a" for c in COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", default="1,4,8,32")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--no-stack", action="store_true", help="skip the 30-layer rows")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    row_counts = [int(r) for r in args.rows.split(",")]
    probe = Int4Linear(torch.randn(8, 32))
    cpu = cpu_info()
    lines = [
        f"## Quantized linear kernels, CPU kind {cpu.kind} (bench/quant_kernels.py)",
        "",
        f"CPU: {cpu.describe()}, {args.threads} threads.",
        "",
        f"Command: `python -m bench.quant_kernels --threads {args.threads} --rows {args.rows}`; CPU "
        f"capability {torch.backends.cpu.get_cpu_capability()}; int4 layers on {probe.backend}; min / median "
        f"microseconds per call over {args.reps} interleaved repetitions.",
        "",
        "| shape (out x in) | rows | " + " | ".join(HEADERS) + " |",
        "|---|---|" + "---|" * len(HEADERS),
    ]
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k) * 0.05
        layers = layers_for(weight, with_fp32_fallback=name != "lm_head")  # the fallback takes seconds there
        for rows in row_counts:
            x = inputs(torch.randn(rows, k))
            t = time_us({c: (lambda f=f, x=x[c]: f(x)) for c, f in layers.items()}, args.reps)
            lines.append(f"| {name} {n}x{k} | {rows} | {cells(t)} |")
            print(lines[-1], flush=True)
    if not args.no_stack:
        # A decode step's linear layers: 30 layers of distinct weights, so they stream from memory.
        stack = [
            {s: layers_for(torch.randn(*SHAPES[s]) * 0.05, with_fp32_fallback=False) for s in LAYER_SHAPES}
            for _ in range(NUM_LAYERS)
        ]
        for rows in row_counts:
            xs = {s: inputs(torch.randn(rows, SHAPES[s][1])) for s in LAYER_SHAPES}

            def step(column: str, xs: dict[str, dict[str, torch.Tensor]] = xs) -> None:
                for layer in stack:
                    for s in LAYER_SHAPES:
                        layer[s][column](xs[s][column])

            columns = [c for c in COLUMNS if c != "int4pack_fp32" and c in stack[0][LAYER_SHAPES[0]]]
            t = time_us({c: (lambda c=c: step(c)) for c in columns}, max(3, args.reps // 3))
            lines.append(f"| stack: {NUM_LAYERS} layers | {rows} | {cells(t)} |")
            print(lines[-1], flush=True)
    if PANEL_ROWS:
        _ops.set_bf16_panel_min_rows(PANEL_ROWS)
    body = "\n".join(lines)
    if args.write_docs:
        write_section(cpu_section("quant-kernels", cpu.kind), body)  # one section per CPU kind


if __name__ == "__main__":
    main()
