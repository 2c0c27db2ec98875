"""Dequantize + bfloat16 GEMM for batches of many rows (worker/model/quant.py `DEQUANTIZE_MIN_ROWS`; the
kernels int8_dequantize and int4_dequantize in worker/kernels/).

The dequantized weights are checked element by element against the layer's own definition of its weights
(int8: q s; int4: d q + m rounded once, as the kernel's FMA does) rounded to bfloat16; the layer's output on
that path must then be exactly oneDNN's bfloat16 GEMM over those weights.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.engine.kernel_grid import int8_rows_on_grid, on_chunk_grid
from worker.kernels import native_ops
from worker.model.decode_layers import DecodeLayers
from worker.model.quant import (
    Int4Groups,
    Int4Linear,
    Int8Linear,
    dequantize_min_rows,
    native_cpu_bfloat16,
)


def dequantize_ops():
    ops = native_ops()
    if ops is None or not hasattr(ops, "int8_dequantize"):
        pytest.skip("native kernels not built (make kernels)")
    return ops


def int4_reference(groups: Int4Groups) -> torch.Tensor:
    """d q + m with one rounding to float32 (float64 arithmetic, exact here), then to bfloat16."""
    n, k = groups.codes.shape
    q = groups.codes.double().reshape(n, k // 32, 32)
    scales, mins = groups.scales.half().double(), groups.mins.half().double()
    return (q * scales[..., None] + mins[..., None]).reshape(n, k).float().bfloat16()


@pytest.mark.parametrize("in_features", [40, 576, 1536])  # a tail after 8-wide steps; the model's widths
def test_int8_dequantize_is_codes_times_scale_rounded_to_bfloat16(in_features):
    ops = dequantize_ops()
    gen = torch.Generator().manual_seed(in_features)
    layer = Int8Linear(torch.randn(70, in_features, generator=gen))
    out = torch.empty(70, in_features, dtype=torch.bfloat16)
    ops.int8_dequantize(layer.weight, layer.scales, out)
    assert torch.equal(out, (layer.weight.float() * layer.scales[:, None]).bfloat16())


@pytest.mark.parametrize("in_features", [32, 96, 1536])
def test_int4_dequantize_is_d_q_plus_m_rounded_to_bfloat16(in_features):
    ops = dequantize_ops()
    gen = torch.Generator().manual_seed(in_features)
    groups = Int4Groups.from_float(torch.randn(40, in_features, generator=gen))
    layer = Int4Linear(groups.dequantize(), groups=groups)
    out = torch.empty(40, in_features, dtype=torch.bfloat16)
    ops.int4_dequantize(layer.weight, layer.scales, layer.mins, out)
    # the plain-loop path (CPUs without AVX2/FMA) rounds d q before adding m: one bfloat16 step apart at most
    torch.testing.assert_close(out.float(), int4_reference(groups).float(), rtol=2**-7, atol=1e-6)


def test_dequantize_kernels_refuse_mismatched_shapes_and_types():
    ops = dequantize_ops()
    codes = torch.zeros(8, 64, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="int8_dequantize"):
        ops.int8_dequantize(codes, torch.ones(8), torch.empty(8, 64))  # float32 out
    with pytest.raises(RuntimeError, match="int8_dequantize"):
        ops.int8_dequantize(codes, torch.ones(7), torch.empty(8, 64, dtype=torch.bfloat16))
    packed, half = torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 2, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="int4_dequantize"):
        ops.int4_dequantize(packed, half, half, torch.empty(8, 48, dtype=torch.bfloat16))


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_a_batch_of_many_rows_runs_bfloat16_gemm_over_the_dequantized_weights(quantization):
    dequantize_ops()
    gen = torch.Generator().manual_seed(7)
    weight, bias = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    if quantization == "int8":
        layer = Int8Linear(weight, bias)
        exact_weights = layer.weight.float() * layer.scales[:, None]
        dequantized = exact_weights.bfloat16()
    else:
        groups = Int4Groups.from_float(weight)
        layer = Int4Linear(weight, bias, groups)
        exact_weights, dequantized = groups.dequantize(), int4_reference(groups)
    assert layer.dequantize_from == dequantize_min_rows(torch.device("cpu"))
    assert (layer.dequantize_from is None) == (not native_cpu_bfloat16())
    layer.dequantize_from = 8  # the path runs on any CPU (emulated bfloat16 without native support)
    x = torch.randn(8, 64, generator=gen)
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (8, 96)
    expected = F.linear(x.bfloat16(), dequantized).float() + bias
    if quantization == "int8":
        assert torch.equal(got, expected)
    else:  # the plain-loop path's weights may be one bfloat16 step off (above)
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    # below the threshold the native kernel runs over the exact weights (int8: float32 products, or x on the
    # 16-bit grid where the build runs batches there; int4's AVX512-BF16 path rounds x to bfloat16,
    # test_int4_kernel.py), not over bfloat16-rounded ones
    native = layer(x[:7])
    on_grid = quantization == "int8" and int8_rows_on_grid(7)
    read = on_chunk_grid(x[:7].double()) if on_grid else x[:7].double()
    exact = read @ exact_weights.double().T + bias.double()
    tolerance = 1e-5 if quantization == "int8" else 1e-2
    assert float((native.double() - exact).norm() / exact.norm()) < tolerance


def test_decode_layers_op_steps_aside_from_the_dequantizing_batch_size():
    layers = DecodeLayers(None, 8, [], [], [], [], [], [], 9, 3, 1e-5, max_tokens=24)

    class Meta:
        native_decode, num_decodes, prefills = True, 23, []

    assert layers.applies(Meta, 23)
    Meta.num_decodes = 24
    assert not layers.applies(Meta, 24)
    layers.max_tokens = None
    assert layers.applies(Meta, 24)
    Meta.prefills = [object()]
    assert not layers.applies(Meta, 24)
