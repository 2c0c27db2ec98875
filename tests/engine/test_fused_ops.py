"""The fused per-layer kernels against the torch code they replace (worker/model/model.py's torch path)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker.kernels import native_ops

EPS = 1e-5


def _tol(dtype: torch.dtype) -> dict:
    # float32: only the summation order differs. bfloat16: the same roundings, but a sum that lands on a
    # rounding boundary may go the other way: one bf16 step (2^-8 relative).
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 8e-3}


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


@pytest.fixture(scope="module")
def ops():
    loaded = native_ops()
    assert loaded is not None, "the kernels are built by `make kernels`, a dependency of `make test`"
    return loaded


DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 3, 33]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("width", [64, 576, 37])
def test_rms_norm_and_add_rms_norm(ops, dtype, rows, width):
    gen = torch.Generator().manual_seed(rows * width)
    x = torch.randn(rows, width, generator=gen).to(dtype)
    residual = (3 * torch.randn(rows, width, generator=gen)).to(dtype)
    weight = torch.rand(width, generator=gen).to(dtype) + 0.5
    out = torch.empty_like(x)
    ops.rms_norm(x, weight, EPS, out)
    torch.testing.assert_close(out, _rms_norm(x, weight), **_tol(dtype))

    expected_residual = residual + x
    ops.add_rms_norm(x, residual, weight, EPS, out)
    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0)  # an add rounds once either way
    torch.testing.assert_close(out, _rms_norm(expected_residual, weight), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_rotary_in_place_on_fused_qkv(ops, dtype, rows):
    heads, kv_heads, dim, max_pos = 9, 3, 64, 300
    gen = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    angles = torch.arange(max_pos).unsqueeze(1) * (10000 ** (-torch.arange(dim // 2) / (dim // 2)))
    cos = torch.cat([angles.cos(), angles.cos()], dim=1).to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=1).to(dtype)
    positions = torch.randint(0, max_pos, (rows,), generator=gen)

    def rotate(x: torch.Tensor) -> torch.Tensor:  # the torch path of worker/model/model.py
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        half = dim // 2
        return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s

    q_size, kv_size = heads * dim, kv_heads * dim
    expected_q = rotate(qkv[:, :q_size].view(rows, heads, dim))
    expected_k = rotate(qkv[:, q_size : q_size + kv_size].view(rows, kv_heads, dim))
    expected_v = qkv[:, q_size + kv_size :].clone()
    ops.rotary_(qkv, positions, cos, sin, heads + kv_heads)
    torch.testing.assert_close(qkv[:, :q_size].view(rows, heads, dim), expected_q, **_tol(dtype))
    torch.testing.assert_close(
        qkv[:, q_size : q_size + kv_size].view(rows, kv_heads, dim), expected_k, **_tol(dtype)
    )
    assert torch.equal(qkv[:, q_size + kv_size :], expected_v), "values must not be rotated"
    with pytest.raises(RuntimeError, match="position out of range"):
        ops.rotary_(qkv, positions + max_pos, cos, sin, heads + kv_heads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("width", [1536, 20])
def test_silu_and_mul(ops, dtype, rows, width):
    gen = torch.Generator().manual_seed(rows + width)
    x = (4 * torch.randn(rows, 2 * width, generator=gen)).to(dtype)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's clamped range and zero
    out = x.new_empty(rows, width)
    ops.silu_and_mul(x, out)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(out, F.silu(gate) * up, **_tol(dtype))


def test_shape_and_dtype_errors(ops):
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="float32 and bfloat16"):
        ops.rms_norm(x.double(), torch.ones(8, dtype=torch.double), EPS, torch.empty_like(x.double()))
    with pytest.raises(RuntimeError, match=r"\[T, 2n\]"):
        ops.silu_and_mul(x, torch.empty(2, 3))
