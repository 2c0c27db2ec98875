"""A prefill chunk after cached context: its grouped query heads taken as rows of one head (short chunks)
give the same attention as SDPA's grouped-query path and as a plain softmax reference."""

from __future__ import annotations

import pytest
import torch

import worker.model.attention as attention
from worker.model.attention import AttentionMetadata, PrefillChunk, paged_attention


def run_chunk(dtype: torch.dtype, n: int, cached: int, window: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n * 100 + cached)
    heads, kv_heads, dim, block = 6, 2, 16, 16
    context = cached + n
    blocks = (context + block - 1) // block
    k_cache = torch.randn(kv_heads, blocks + 2, block, dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, blocks + 2, block, dim, generator=gen).to(dtype)
    table = torch.arange(blocks) + 1  # blocks 1.. hold the sequence (0 and the last unused)
    q = torch.randn(n, heads, dim, generator=gen).to(dtype)
    k = torch.randn(n, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(n, kv_heads, dim, generator=gen).to(dtype)
    positions = torch.arange(cached, context)
    slots = table[positions // block] * block + positions % block
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=0, decode_block_tables=None, decode_mask=None,
        prefills=[PrefillChunk(0, n, context, table)],
    )  # fmt: skip
    out = paged_attention(q, k, v, k_cache, v_cache, meta, window)
    # reference: every query against the keys up to its own position, in float64
    keys = k_cache[:, table].reshape(kv_heads, -1, dim)[:, :context].double()
    values = v_cache[:, table].reshape(kv_heads, -1, dim)[:, :context].double()
    for i in range(n):
        pos = cached + i
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(heads):
            g = h // (heads // kv_heads)
            scores = keys[g, lo : pos + 1] @ q[i, h].double() * dim**-0.5
            expected = scores.softmax(0) @ values[g, lo : pos + 1]
            tolerance = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(out[i, h].double(), expected, rtol=tolerance, atol=tolerance)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "cached"), [(1, 40), (7, 25), (32, 512), (64, 100), (65, 100)])
def test_a_cached_chunk_attends_like_the_reference_both_ways(monkeypatch, dtype, n, cached):
    rows = run_chunk(dtype, n, cached)
    monkeypatch.setattr(attention, "GROUPED_ROWS_MAX_TOKENS", 0)  # SDPA's grouped-query path
    grouped = run_chunk(dtype, n, cached)
    torch.testing.assert_close(rows, grouped, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-2)


def test_a_sliding_window_holds_on_the_rows_path():
    run_chunk(torch.float32, 12, 60, window=20)
