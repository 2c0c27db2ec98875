"""4-bit weights x 8-bit activation rows (worker/model/w4a8.py, worker/kernels/w4a8_linear.cpp): the kernel's
exact integer sums, its layout, rows independent of their batch, and a model whose decoder linears are w4a8 on
the int4 layer's groups (a GGUF file's own blocks for the bundled model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.factories import tiny_llama
from worker.kernels import native_op, native_ops
from worker.model.cpu_kind import cpu_info
from worker.model.model import LlamaForPagedAttention
from worker.model.quant import Int4Groups, Int4Linear
from worker.model.w4a8 import GROUP, W4A8Linear, w4a8_available
from worker.model.w8a8 import ZERO_POINT, W8A8Linear, quantize_rows, row_max_code

needs_kernel = pytest.mark.skipif(
    not w4a8_available(torch.device("cpu")), reason="no w4a8 kernel here (make kernels; AVX2)"
)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm())


def layer(out_features: int = 48, in_features: int = 96, seed: int = 0) -> tuple[W4A8Linear, torch.Tensor]:
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.1
    return W4A8Linear(weight), weight


def test_the_kernel_is_built_where_the_cpu_has_avx2():
    """A build for an AVX2 CPU has the kernel: a build that loses it fails here instead of leaving w4a8
    refused at start unnoticed."""
    ops = native_ops()
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    assert hasattr(ops, "w4a8_linear") and ops.w4a8_linear_supported() == ("avx2" in cpu_info().flags)


@needs_kernel
def test_the_packed_layout_reads_back_as_the_groups_it_was_made_from():
    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(2))
    groups = Int4Groups.from_float(weight)
    packed = W4A8Linear(weight, None, groups)
    back = packed.groups()
    assert torch.equal(back.codes, groups.codes)
    # float16 in the layout, as a GGUF file has them (`from_float` rounds them so: exact)
    assert torch.equal(back.scales, groups.scales) and torch.equal(back.mins, groups.mins)
    # byte 4 c + j of a step: channel c's code for column j low, channel c + 8's high
    step = packed.weight[1, 3]  # channels 16..31, columns 12..15
    assert int(step[4 * 2 + 1]) == int(groups.codes[18, 13]) | int(groups.codes[26, 13]) << 4


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 11, 16, 33, 64])
def test_the_kernel_is_the_exact_integer_sums_scaled(rows):
    """Every tile height: the output is s_x (d sum q_x q_w + m sum q_x) per group, summed (float64 reference
    of the same integer sums), with codes from a torch reference of the rows' quantization."""
    linear, _ = layer()
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    x[:, 5] *= 30  # an outlier column: only its own group's scale widens
    got = linear(x)
    codes, scales = quantize_rows(x, 127, GROUP)
    q_x = (codes.double() - ZERO_POINT).reshape(rows, -1, GROUP)
    groups = linear.groups()
    q_w = groups.codes.double().reshape(48, -1, GROUP)
    sums = torch.einsum("mgk,ngk->mng", q_x, q_w)
    expected = (
        sums * groups.scales.double() + q_x.sum(-1)[:, None] * groups.mins.double()
    ) * scales.double()[:, None]
    torch.testing.assert_close(got.double(), expected.sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), linear.reference(x), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_rows_output_does_not_depend_on_its_batch():
    """Each row is quantized on its own, so its outputs are the same bits in any batch (a prompt's logprobs
    equal the sampled token's)."""
    linear, _ = layer(seed=4)
    x = torch.randn(12, 96, generator=torch.Generator().manual_seed(5))
    batch = linear(x)
    for rows in (1, 2, 3, 4, 5, 6, 7):
        assert torch.equal(linear(x[:rows]), batch[:rows])
        assert torch.equal(linear(x[rows - 1 : rows + 4]), batch[rows - 1 : rows + 4])


@needs_kernel
def test_the_layer_stays_close_to_the_int4_layer_on_the_same_weights():
    """Only the rows' rounding to 8 bits separates it from int4 (the same groups; int4 multiplies float32
    rows, or rows rounded to bfloat16 where the CPU has AVX512-BF16: int4_linear.cpp)."""
    weight = torch.randn(64, 192, generator=torch.Generator().manual_seed(6)) * 0.05
    groups = Int4Groups.from_float(weight)
    x = torch.randn(9, 192, generator=torch.Generator().manual_seed(7))
    int4, w4a8 = Int4Linear(weight, None, groups), W4A8Linear(weight, None, groups)
    int4_rows = x.bfloat16() if "avx512_bf16" in cpu_info().flags else x
    torch.testing.assert_close(
        int4(x).double(), int4_rows.double() @ groups.dequantize().double().T, rtol=1e-4, atol=1e-4
    )
    assert relative_error(w4a8(x), int4(x)) < 0.01


@needs_kernel
def test_bfloat16_rows_read_as_their_float32_values_and_out_is_their_dtype():
    linear, _ = layer(seed=8)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    got = linear(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), linear(x.float()).to(torch.bfloat16).float(), rtol=0, atol=0)


@needs_kernel
def test_bias_is_added_in_float32():
    weight = torch.randn(16, 64, generator=torch.Generator().manual_seed(10))
    bias = torch.randn(16, generator=torch.Generator().manual_seed(11))
    with_bias, without = W4A8Linear(weight, bias), W4A8Linear(weight)
    x = torch.randn(3, 64)
    torch.testing.assert_close(with_bias(x), without(x) + bias)


@needs_kernel
def test_shapes_of_partial_groups_or_blocks_are_refused_by_the_layer_and_the_kernel():
    with pytest.raises(ValueError, match="in_features a multiple of 32 and out_features of 16"):
        W4A8Linear(torch.randn(16, 48))
    with pytest.raises(ValueError, match="in_features a multiple of 32 and out_features of 16"):
        W4A8Linear(torch.randn(24, 64))
    linear, _ = layer()
    ops = native_op("w4a8_linear")
    with pytest.raises(RuntimeError, match="shapes differ"):
        ops.w4a8_linear(torch.randn(2, 64), linear.weight, linear.scales_mins, torch.empty(2, 48))
    with pytest.raises(RuntimeError, match="codes must be in 0..15"):
        codes = torch.full((16, 32), 16, dtype=torch.uint8)
        scales = torch.ones(16, 1)
        packed = torch.empty(1, 8, 32, dtype=torch.uint8)
        ops.w4a8_pack_weight(codes, scales, scales, packed, torch.empty(1, 1, 32, dtype=torch.float16))


def test_w4a8_says_what_it_needs_where_the_kernel_is_missing(monkeypatch):
    monkeypatch.setattr("worker.model.w4a8.native_op", lambda name: None)
    with pytest.raises(ValueError, match="needs the compiled kernels"):
        W4A8Linear(torch.randn(16, 64))


@needs_kernel
def test_a_w4a8_model_runs_every_decoder_linear_on_the_int4_groups_it_is_given():
    """The decoder linears are w4a8 layers; where 4-bit groups are given (a GGUF file's blocks, by Hugging
    Face name) the fused projections carry exactly those, else they are quantized from float. The head is
    the w8a8 model's (integer rows on the AVX2 GEMM)."""
    hf = tiny_llama()
    prefix = "model.layers.0."
    given = {
        f"{prefix}self_attn.{name}.weight": Int4Groups.from_float(
            hf.get_submodule(f"{prefix}self_attn.{name}").weight
        )
        for name in ("q_proj", "k_proj", "v_proj")
    }
    model = LlamaForPagedAttention(hf, 64, quantization="w4a8", int4_groups=given)
    roles = ("qkv", "o_proj", "gate_up", "down")
    assert all(type(getattr(layer, role)) is W4A8Linear for layer in model.layers for role in roles)
    assert model.linear_backend == "native-w4a8"
    fused = Int4Groups.cat([given[f"{prefix}self_attn.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj")])
    assert torch.equal(model.layers[0].qkv.groups().codes, fused.codes)
    assert (type(model.lm_head) is W8A8Linear) == (row_max_code() < 127)
    reference = LlamaForPagedAttention(hf, 64)
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(12))
    for role in roles:
        layer_f, layer_q = getattr(reference.layers[1], role), getattr(model.layers[1], role)
        x = hidden.repeat(1, layer_f.in_features // 64 + 1)[:, : layer_f.in_features]
        assert relative_error(layer_q(x), layer_f(x)) < 0.15  # 16 levels per group of 32, as int4's


MODEL_DIR = Path("models/SmolLM2-135M-Instruct")


@needs_kernel
@pytest.mark.skipif(not (MODEL_DIR / "config.json").exists(), reason="model not fetched (make model)")
def test_the_bundled_model_in_w4a8_keeps_the_gguf_blocks_and_predicts_what_the_unquantized_one_does():
    """The real model's w4a8 weights are its GGUF file's Q4_1 blocks, the very values of its float32 weights
    (converted from that file); on a passage of the tune text its next tokens agree with float32's almost
    everywhere and its mean negative log-likelihood is within 2% (perplexity is measured by
    bench/quant_study.py)."""
    from tests.engine.test_w8a8 import against_unquantized
    from worker.model.loader import load_hf_model, load_model

    hf = load_hf_model(str(MODEL_DIR), "float32", "cpu")
    model = load_model(str(MODEL_DIR), "float32", "cpu", 64, "auto", "w4a8")
    down = model.layers[3].down.groups().dequantize()
    torch.testing.assert_close(
        down, hf.model.layers[3].mlp.down_proj.weight.detach().float(), rtol=1e-6, atol=1e-7
    )
    agreement, nll_ratio = against_unquantized("w4a8", "float32")
    assert agreement >= 0.9, f"top-1 agreement {agreement:.2f}"
    assert abs(nll_ratio - 1) < 0.02
