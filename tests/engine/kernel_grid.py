"""How the native int8 kernel's one-row path reads x (int8_linear.cpp, `grid_row` and `grid_row_avx2`),
for test references."""

from __future__ import annotations

import torch

from worker.kernels import native_ops


def int8_one_row_on_grid(rows: int) -> bool:
    """A single row below the panel GEMM's rows runs on the grid where the build has integer one-row
    products (AVX512-VNNI, or AVX2 without it: `int8_one_row_path`)."""
    ops = native_ops()
    panel_rows = ops.bf16_panel_min_rows() if ops is not None else 0
    below_panel = not 0 < panel_rows <= rows
    return rows == 1 and below_panel and ops is not None and ops.int8_one_row_path() != "float"


def on_chunk_grid(x: torch.Tensor) -> torch.Tensor:
    """x (float64) per chunk of 64 on the grid of step 2^(e - 14) where 2^e <= max |x| < 2^(e + 1), rounded to
    nearest even and held within +-32767 steps."""
    k = x.shape[-1]
    padded = torch.nn.functional.pad(x, (0, -k % 64)).reshape(x.shape[0], -1, 64)
    top = padded.abs().amax(-1, keepdim=True)
    step = torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent - 15)
    return (torch.round(padded / step).clamp(-32767, 32767) * step).reshape(x.shape[0], -1)[:, :k]
