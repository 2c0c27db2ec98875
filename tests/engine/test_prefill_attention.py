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


NATIVE = pytest.mark.skipif(
    attention._native_prefill() is None, reason="the native prefill-attention kernel needs AMX or AVX512-BF16"
)


def run_native_chunk(
    n: int, cached: int, heads: int, kv_heads: int, native: bool, key_growth: float = 0.0
) -> torch.Tensor:
    """A bfloat16 chunk of head size 64 through paged_attention, on the native kernel or (the torch backend)
    SDPA, the pool's unused rows NaN (a block's rows past the context are read into a tile, never used). The
    key at position t is scaled by 1 + key_growth t."""
    gen = torch.Generator().manual_seed(n * 7 + cached)
    dim, block, context = 64, 16, cached + n
    blocks = (context + block - 1) // block
    k_cache = torch.full((kv_heads, blocks + 3, block, dim), float("nan"), dtype=torch.bfloat16)
    v_cache = torch.full((kv_heads, blocks + 3, block, dim), float("nan"), dtype=torch.bfloat16)
    table = torch.randperm(blocks + 3, generator=gen)[:blocks]
    earlier = torch.arange(cached)
    k_cache[:, table[earlier // block], earlier % block] = (
        torch.randn(kv_heads, cached, dim, generator=gen) * (1 + key_growth * earlier)[None, :, None]
    ).bfloat16()
    v_cache[:, table[earlier // block], earlier % block] = torch.randn(
        kv_heads, cached, dim, generator=gen
    ).bfloat16()
    q = torch.randn(n, heads, dim, generator=gen).bfloat16()
    positions = torch.arange(cached, context)
    growth = (1 + key_growth * positions)[:, None, None]
    k = (torch.randn(n, kv_heads, dim, generator=gen) * growth).bfloat16()
    v = torch.randn(n, kv_heads, dim, generator=gen).bfloat16()
    meta = AttentionMetadata(
        slot_mapping=table[positions // block] * block + positions % block, num_decodes=0,
        decode_block_tables=None, decode_mask=None, prefills=[PrefillChunk(0, n, context, table)],
        native_prefill=native,  # as the runner sets it: the native attention backend, or torch ops only
    )  # fmt: skip
    return paged_attention(q, k, v, k_cache, v_cache, meta)


@NATIVE
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 1), (8, 8)])
@pytest.mark.parametrize(
    ("n", "cached"), [(1, 0), (5, 0), (1, 40), (7, 25), (32, 512), (100, 28), (128, 0), (300, 200)]
)
def test_the_native_kernel_attends_as_sdpa_does(heads, kv_heads, n, cached):
    """Fresh chunks and chunks after cached context, contexts ending inside a 16-row block, 1 to 9 query
    heads per KV head: the kernel's output against SDPA's on the same pool, within bfloat16 rounding."""
    native = run_native_chunk(n, cached, heads, kv_heads, native=True)
    expected = run_native_chunk(n, cached, heads, kv_heads, native=False)
    assert not native.isnan().any()
    torch.testing.assert_close(native.float(), expected.float(), rtol=2e-2, atol=2e-2)


@NATIVE
@pytest.mark.parametrize(("n", "cached"), [(40, 530), (200, 0)])
def test_scores_that_grow_along_the_context_move_the_running_max_and_rescale_the_sums(n, cached):
    """Keys ever longer along the context: a row's scores leave its running max far behind many times, and
    each time what it summed so far must be rescaled (the steps before would otherwise outweigh the rest)."""
    native = run_native_chunk(n, cached, 9, 3, native=True, key_growth=0.1)
    expected = run_native_chunk(n, cached, 9, 3, native=False, key_growth=0.1)
    assert not native.isnan().any()
    torch.testing.assert_close(native.float(), expected.float(), rtol=2e-2, atol=2e-2)


def run_native_step(native: bool) -> torch.Tensor:
    """Three chunks in one step: two over the same cached 64-token prefix (its blocks shared, as the prefix
    cache hands them out; the kernel lays shared steps out once), one over context of its own that ends
    inside a block, a long fresh-ish chunk beside them, the pool's unused rows NaN."""
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, dim, block = 9, 3, 64, 16
    pool = 40
    k_cache = torch.full((kv_heads, pool, block, dim), float("nan"), dtype=torch.bfloat16)
    v_cache = torch.full((kv_heads, pool, block, dim), float("nan"), dtype=torch.bfloat16)
    order = torch.randperm(pool, generator=gen)
    shared = order[:4]  # the 64-token prefix
    specs = [  # (block table, cached tokens, new tokens)
        (torch.cat([shared, order[4:7]]), 64, 40),
        (torch.cat([shared, order[7:9]]), 64, 9),
        (order[9:13], 37, 20),
        (order[13:25], 10, 170),
    ]
    slots, start, prefills = [], 0, []
    for table, cached, n in specs:
        positions = torch.arange(cached + n)
        slot = table[positions // block] * block + positions % block
        if table is specs[1][0]:  # the shared prefix is already in the pool from the first chunk
            slot = slot[64:]
        for cache in (k_cache, v_cache):
            earlier = slot[: len(slot) - n]
            cache.view(kv_heads, -1, dim)[:, earlier] = torch.randn(
                kv_heads, len(earlier), dim, generator=gen
            ).bfloat16()
        slots.append(slot[len(slot) - n :])
        prefills.append(PrefillChunk(start, n, cached + n, table))
        start += n
    q = torch.randn(start, heads, dim, generator=gen).bfloat16()
    k = torch.randn(start, kv_heads, dim, generator=gen).bfloat16()
    v = torch.randn(start, kv_heads, dim, generator=gen).bfloat16()
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots), num_decodes=0, decode_block_tables=None, decode_mask=None,
        prefills=prefills, native_prefill=native,
    )  # fmt: skip
    return paged_attention(q, k, v, k_cache, v_cache, meta)


@NATIVE
def test_a_step_of_chunks_over_a_shared_prefix_attends_as_sdpa_does():
    native = run_native_step(native=True)
    expected = run_native_step(native=False)
    assert not native.isnan().any()
    torch.testing.assert_close(native.float(), expected.float(), rtol=2e-2, atol=2e-2)
