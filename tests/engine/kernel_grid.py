"""How the native int8 kernel reads x on its integer paths (int8_linear.cpp: `grid_row`, `grid_row_avx2`,
`grid_rows_avx2`), for test references."""

from __future__ import annotations

import torch

from worker.kernels import native_ops


def int8_rows_on_grid(rows: int) -> bool:
    """Rows below the panel GEMM's rows run on the grid up to `int8_grid_max_rows`: one row where the build
    has integer one-row products (AVX512-VNNI), every row count on an AVX2 build without it, none where the
    products are float."""
    ops = native_ops()
    if ops is None:
        return False
    panel_rows = ops.bf16_panel_min_rows()
    below_panel = not 0 < panel_rows <= rows
    return below_panel and rows <= ops.int8_grid_max_rows()


def on_chunk_grid(x: torch.Tensor) -> torch.Tensor:
    """x (float64) per chunk of 64 on the grid of step 2^(e - 14) where 2^e <= max |x| < 2^(e + 1), rounded to
    nearest even and held within +-32767 steps."""
    k = x.shape[-1]
    padded = torch.nn.functional.pad(x, (0, -k % 64)).reshape(x.shape[0], -1, 64)
    top = padded.abs().amax(-1, keepdim=True)
    step = torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent - 15)
    return (torch.round(padded / step).clamp(-32767, 32767) * step).reshape(x.shape[0], -1)[:, :k]
