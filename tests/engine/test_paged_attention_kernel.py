"""The native decode kernel against the torch gather path, on the shapes and dtypes the engine uses."""

from __future__ import annotations

import pytest
import torch

from worker.kernels import native_ops
from worker.model.attention import AttentionMetadata, _decode, resolve_attention_backend, write_kv


def _case(num_seqs, num_heads, num_kv, head_dim, block_size, dtype, seed=0, lens=None):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 96 if lens is None else 512
    k_cache = torch.randn(num_kv, num_blocks, block_size, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_kv, num_blocks, block_size, head_dim, generator=gen).to(dtype)
    # Context lengths cover 1 token, a partial block, whole blocks and lengths that are not multiples of 8.
    lens = lens or [1, 5, 8, 17, block_size * 3, 29, 64, 3]
    context_lens = torch.tensor(lens[:num_seqs], dtype=torch.long)
    max_blocks = int((context_lens.max() + block_size - 1) // block_size)
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in range(num_seqs)])
    q = torch.randn(num_seqs, num_heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, context_lens


def _reference(q, k_cache, v_cache, tables, context_lens):
    block_size = k_cache.shape[2]
    span = torch.arange(tables.shape[1] * block_size)
    mask = (span.unsqueeze(0) >= context_lens.unsqueeze(1)).view(1, len(q), 1, -1)
    meta = AttentionMetadata(None, len(q), tables, mask, [])
    group = q.shape[1] // k_cache.shape[0]
    return _decode(q.float(), k_cache.float(), v_cache.float(), mask, meta, group)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv", "head_dim"), [(9, 3, 64), (4, 2, 16), (4, 4, 128), (2, 1, 40)]
)
@pytest.mark.parametrize("block_size", [1, 16])
def test_kernel_matches_gather_path(dtype, num_heads, num_kv, head_dim, block_size):
    ops = native_ops()
    assert ops is not None, "the kernel is built by `make kernels`, a dependency of `make test`"
    q, k_cache, v_cache, tables, lens = _case(8, num_heads, num_kv, head_dim, block_size, dtype)
    out = torch.empty_like(q)
    ops.decode_attention(q, k_cache, v_cache, tables, lens, head_dim**-0.5, out)
    expected = _reference(q, k_cache, v_cache, tables, lens)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output is rounded to 8 mantissa bits
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv", "head_dim"), [(9, 3, 64), (8, 2, 64), (4, 4, 64), (8, 2, 128), (4, 4, 128)]
)
def test_kernel_matches_gather_path_over_several_token_blocks(dtype, num_heads, num_kv, head_dim):
    """Contexts around the float32 path's 64-row blocks and the bfloat16 path's 16-row steps and token
    pairs (odd lengths), for every group size the bfloat16 path is compiled for."""
    ops = native_ops()
    assert ops is not None, "the kernel is built by `make kernels`, a dependency of `make test`"
    lens = [63, 64, 65, 128, 150, 200, 257, 1]
    q, k_cache, v_cache, tables, lens = _case(8, num_heads, num_kv, head_dim, 16, dtype, seed=1, lens=lens)
    out = torch.empty_like(q)
    ops.decode_attention(q, k_cache, v_cache, tables, lens, head_dim**-0.5, out)
    expected = _reference(q, k_cache, v_cache, tables, lens)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)


def test_kernel_rejects_what_it_cannot_run():
    ops = native_ops()
    q, k_cache, v_cache, tables, lens = _case(4, 4, 2, 16, 16, torch.float32)
    with pytest.raises(RuntimeError, match="int64"):
        ops.decode_attention(q, k_cache, v_cache, tables.int(), lens, 0.25, torch.empty_like(q))
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops.decode_attention(q.double(), k_cache, v_cache, tables, lens, 0.25, torch.empty_like(q))


def test_backend_resolution():
    cpu = torch.device("cpu")
    assert resolve_attention_backend("auto", cpu, torch.float32) == "native"
    assert resolve_attention_backend("auto", cpu, torch.float16) == "torch"
    assert resolve_attention_backend("torch", cpu, torch.float32) == "torch"
    with pytest.raises(ValueError, match="native attention kernel runs on CPU"):
        resolve_attention_backend("native", torch.device("cuda"), torch.float32)
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_attention_backend("flash", cpu, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_puts_each_row_where_index_copy_does(dtype):
    """K and V as the fused QKV output's column views (rows strided, heads contiguous), slots scattered."""
    ops = native_ops()
    gen = torch.Generator().manual_seed(11)
    num_kv, dim, heads, tokens = 3, 64, 9, 37
    qkv = torch.randn(tokens, (heads + 2 * num_kv) * dim, generator=gen).to(dtype)
    k = qkv[:, heads * dim : (heads + num_kv) * dim].view(tokens, num_kv, dim)
    v = qkv[:, (heads + num_kv) * dim :].view(tokens, num_kv, dim)
    slots = torch.randperm(20 * 16, generator=gen)[:tokens]
    expected_k, expected_v = (
        torch.zeros(num_kv, 20, 16, dim, dtype=dtype),
        torch.zeros(num_kv, 20, 16, dim, dtype=dtype),
    )
    write_kv(expected_k, slots, k)
    write_kv(expected_v, slots, v)
    k_cache, v_cache = torch.zeros_like(expected_k), torch.zeros_like(expected_v)
    ops.write_kv(k, v, slots, k_cache, v_cache)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    with pytest.raises(RuntimeError, match="slot out of range"):
        ops.write_kv(k, v, torch.full((tokens,), 20 * 16), k_cache, v_cache)
