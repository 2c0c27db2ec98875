"""int8 weights x int8 activations (worker/model/w8a8.py) and the smoothing in front of them
(worker/model/smoothing.py), on small random layers and a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.factories import tiny_llama
from tests.engine.kernel_grid import int8_one_row_on_grid, on_chunk_grid
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.kernels import native_op, native_ops
from worker.model.cpu_kind import cpu_info
from worker.model.loader import load_model
from worker.model.model import LlamaForPagedAttention
from worker.model.runner import ModelRunner
from worker.model.smoothing import activation_ranges, factors, smooth
from worker.model.w8a8 import (
    WEIGHT_ONLY_BELOW,
    ZERO_POINT,
    W8A8Linear,
    native_gemm,
    quantize_rows,
    w8a8_available,
)

pytestmark = pytest.mark.skipif(not w8a8_available(torch.device("cpu")), reason="no oneDNN int8 linear")


def native_paths() -> list[str]:
    """The integer GEMM paths this build and CPU run (w8a8_linear.cpp): vnni wherever it is compiled, amx
    where the tiles are usable; none before `make kernels` or on a CPU with neither."""
    ops = native_op("w8a8_linear")
    usable = ops.w8a8_linear_path() if ops is not None else "none"
    if usable == "none":
        return []
    paths = [usable]
    if usable == "amx":
        try:  # compiled wherever AMX-INT8 is, unless a build targets AMX without AVX512-VNNI
            ops.w8a8_linear(torch.zeros(1, 64), torch.zeros(2, 16, 64, dtype=torch.int8), torch.ones(32),
                            torch.zeros(32, dtype=torch.int32), torch.empty(1, 32), "vnni")  # fmt: skip
            paths.append("vnni")
        except RuntimeError:
            pass
    return paths


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm())


def test_rows_quantize_to_symmetric_codes_with_one_scale_each():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [300.0, 3.0, -300.0]])
    codes, scales = quantize_rows(x)
    assert codes.dtype == torch.uint8 and scales.shape == (3, 1)
    signed = codes.int() - ZERO_POINT
    assert signed.abs().max() <= 127
    assert signed[0].tolist() == [64, -127, 32]  # -2 is the row's largest: -127; 1 -> 63.5 -> 64 (even)
    assert signed[1].tolist() == [0, 0, 0]  # an all-zero row stays zero (no division by zero)
    assert signed[2].tolist() == [127, 1, -127]
    torch.testing.assert_close(signed.float() * scales, x, atol=float(scales.max()) / 2, rtol=0)


@pytest.mark.parametrize("rows", [1, 5, WEIGHT_ONLY_BELOW - 1, WEIGHT_ONLY_BELOW, 64])
def test_w8a8_layer_is_its_integer_products_and_close_to_the_float_layer(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 160, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 160, generator=gen)
    layer = W8A8Linear(weight, bias)
    got = layer(x)
    # The integer sums (or, for few rows, float32 rows against the 8-bit weights) as the float64 reference.
    read = on_chunk_grid(x.double()) if int8_one_row_on_grid(rows) else x
    torch.testing.assert_close(got.double(), layer.reference(read), rtol=1e-5, atol=1e-4)
    assert relative_error(got, x @ weight.T + bias) < 0.02  # at most two 8-bit roundings
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_few_rows_on_onednn_skip_the_activation_rounding_and_many_rows_do_not():
    """On oneDNN's GEMM, below WEIGHT_ONLY_BELOW rows only the weights are 8-bit: a row's result does not
    depend on the other rows. From it the rows are rounded to 8 bits, each on its own scale, so the same row
    differs."""
    if native_op("int8_linear") is None:
        pytest.skip("native kernels not built (make kernels)")
    gen = torch.Generator().manual_seed(7)
    layer = W8A8Linear(torch.randn(64, 128, generator=gen), native=False)
    x = torch.randn(WEIGHT_ONLY_BELOW, 128, generator=gen)
    few, many = layer(x[:1]), layer(x)
    one = on_chunk_grid(x[:1].double()) if int8_one_row_on_grid(1) else x[:1].double()
    exact_weights = one @ (layer.codes.double() * layer.weight_scales.double()[:, None]).T
    torch.testing.assert_close(few.double(), exact_weights, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(many[:1].double(), exact_weights, rtol=1e-5, atol=1e-5)


def test_smoothing_keeps_a_float32_model_unchanged_and_narrows_the_activations():
    """The rescaling is exact in real numbers (norm, v rows and up rows divided; columns multiplied), so a
    float32 model's logits stay; the largest activation per row, against the row's typical one, shrinks."""
    hf = tiny_llama(num_attention_heads=4, num_key_value_heads=2)
    with torch.no_grad():  # outlier channels, as trained models have: a few norm weights far larger
        for layer in hf.model.layers:
            layer.input_layernorm.weight[:3] = 40.0
            layer.post_attention_layernorm.weight[5:7] = 25.0
    ids = [(7 * i + 3) % 250 + 1 for i in range(40)]
    before = hf(input_ids=torch.tensor([ids])).logits
    spread_before = _spread(activation_ranges(hf, ids))
    smooth(hf, ids)
    after = hf(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert _spread(activation_ranges(hf, ids)) < spread_before / 2


def _spread(ranges: dict) -> float:
    """Largest over typical channel range of the q/k/v and gate/up inputs, the worst layer."""
    return max(float(r.max() / r.median()) for (_, role), r in ranges.items() if role in ("qkv", "gate_up"))


def test_factors_balance_activation_and_weight_ranges():
    s = factors(torch.tensor([100.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 2.0]))
    torch.testing.assert_close(s, torch.tensor([10.0, 1.0, 1.0]))  # a channel that never moved stays


def test_w8a8_model_holds_int8_products_in_every_decoder_linear_and_stays_close_to_float():
    hf = tiny_llama()
    float_model = LlamaForPagedAttention(hf, 64)
    quantized = LlamaForPagedAttention(hf, 64, quantization="w8a8")
    roles = ("qkv", "o_proj", "gate_up", "down")
    assert all(type(getattr(layer, role)) is W8A8Linear for layer in quantized.layers for role in roles)
    assert not isinstance(quantized.lm_head, W8A8Linear)  # the head stays unquantized
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    for role in roles:
        layer_f, layer_q = getattr(float_model.layers[0], role), getattr(quantized.layers[0], role)
        x = hidden.repeat(1, layer_f.in_features // 64 + 1)[:, : layer_f.in_features]
        assert relative_error(layer_q(x), layer_f(x)) < 0.03


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_row_quantization_and_rescale_equal_the_torch_steps(dtype):
    ops = native_op("quantize_rows_u8")
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    # 203 columns: the kernel's eight-wide loop and its scalar tail both run
    x = (torch.randn(37, 203, generator=torch.Generator().manual_seed(3)) * 5).to(dtype)
    x[4] = 0.0
    x[5] = 0.0  # scale 2: the halves 0.5, 1.5, 2.5, -0.5, -1.5 round to even (0, 2, 2, 0, -2)
    x[5, :6] = torch.tensor([254.0, 1.0, 3.0, 5.0, -1.0, -3.0])
    codes, scales = torch.empty(x.shape, dtype=torch.uint8), torch.empty(37)
    ops.quantize_rows_u8(x, codes, scales)
    expected_codes, expected_scales = quantize_rows(x)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales[:, 0])
    assert (codes[5, :6].int() - ZERO_POINT).tolist() == [127, 0, 2, 2, 0, -2]
    y, out = torch.randn(37, 50), torch.empty(37, 50, dtype=dtype)
    ops.scale_rows(y, scales, out)
    assert torch.equal(out, (y * scales[:, None]).to(dtype))


def test_the_integer_gemm_is_built_where_the_cpu_has_integer_dot_products():
    """A build for a CPU with AVX512-VNNI runs the VNNI path, one with usable AMX-INT8 tiles the AMX path:
    a build that loses the kernel fails here instead of serving w8a8 through oneDNN unnoticed."""
    ops = native_ops()
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    flags = cpu_info().flags
    tiles = "amx_int8" in flags and ops.amx_linear_supported()  # the same permission the bf16 tiles need
    expected = "amx" if tiles else "vnni" if "avx512_vnni" in flags else "none"
    assert hasattr(ops, "w8a8_linear") and ops.w8a8_linear_path() == expected


def test_packed_weight_is_the_codes_in_groups_of_four_columns_per_sixteen_channels():
    ops = native_op("w8a8_pack_weight")
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    codes = torch.randint(-127, 128, (64, 128), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    packed, compensation = torch.empty(4, 32, 64, dtype=torch.int8), torch.empty(64, dtype=torch.int32)
    ops.w8a8_pack_weight(codes, packed, compensation)
    # packed[b, q, 4 c + i] = codes[16 b + c, 4 q + i]
    expected = codes.reshape(4, 16, 32, 4).permute(0, 2, 1, 3).reshape(4, 32, 64)
    assert torch.equal(packed, expected)
    assert torch.equal(compensation, 128 * codes.int().sum(dim=1, dtype=torch.int32))


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 16, 17, 33, 64, 130])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_native_integer_gemm_is_the_exact_integer_sums_scaled(rows, out_dtype):
    """Every path of the kernel (AMX tiles in groups of 16 rows, VNNI in chunks of 4 rows, 64 channels and 256
    columns; the row counts reach every remainder) gives the exact int32 sums of the row codes against the
    weight codes, times the channel scale, times the row scale, in float32, rounded once to the output dtype:
    the same bits as those steps in torch."""
    paths = native_paths()
    if not paths:
        pytest.skip("no native integer GEMM in this build or on this CPU")
    ops = native_op("w8a8_linear")
    gen = torch.Generator().manual_seed(rows)
    n, k = 96, 576  # 6 channel blocks (a pass of 4 and one of 2 per thread); columns 256 + 256 + 64
    weight = torch.randn(n, k, generator=gen)
    layer = W8A8Linear(weight)
    x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 10
    x[0, :] = 0.0  # an all-zero row: scale 1e-12 / 127, codes 128, sums exactly the compensation
    codes, scales = quantize_rows(x)
    sums = ((codes.double() - ZERO_POINT) @ layer.weight_codes().double().T).float()  # exact: below 2^24
    expected = (sums * layer.weight_scales[None, :] * scales).to(out_dtype)
    for path in paths:
        out = torch.empty(rows, n, dtype=out_dtype)
        ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, out, path)
        assert torch.equal(out, expected), path
        assert torch.equal(out[0], torch.zeros(n, dtype=out_dtype))
    torch.testing.assert_close(layer(x).double(), layer.reference(x), rtol=1e-5, atol=1e-4)


def test_native_integer_gemm_reads_bfloat16_rows_as_their_float32_values():
    paths = native_paths()
    if not paths:
        pytest.skip("no native integer GEMM in this build or on this CPU")
    ops = native_op("w8a8_linear")
    gen = torch.Generator().manual_seed(5)
    layer = W8A8Linear(torch.randn(64, 128, generator=gen))
    x = torch.randn(9, 128, generator=gen).bfloat16()
    for path in paths:
        from_bf16, from_f32 = torch.empty(9, 64), torch.empty(9, 64)
        ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, from_bf16, path)
        ops.w8a8_linear(x.float(), layer.weight, layer.weight_scales, layer.compensation, from_f32, path)
        assert torch.equal(from_bf16, from_f32)


def test_w8a8_layer_runs_the_native_gemm_where_it_applies_and_onednn_elsewhere():
    if not native_paths():
        pytest.skip("no native integer GEMM in this build or on this CPU")
    weight = torch.randn(64, 128)
    native, onednn = W8A8Linear(weight), W8A8Linear(weight, native=False)
    assert native.backend == "native-w8a8" and onednn.backend == "onednn-w8a8"
    # the same codes; the native layer keeps only its own layout of them, and rounds rows at every count
    assert native.codes is None and torch.equal(native.weight_codes(), onednn.weight_codes())
    assert native.weight_only_below is None
    x = torch.randn(1, 128)
    torch.testing.assert_close(native(x).double(), native.reference(x), rtol=1e-5, atol=1e-5)
    assert native(torch.randn(0, 128).bfloat16()).shape == (0, 64)  # an empty batch: an empty result
    assert W8A8Linear(torch.randn(64, 160)).backend == "onednn-w8a8"  # 160 columns: not whole groups of 64
    assert native_gemm(torch.randn(48, 128)) is None  # 48 channels: not whole pairs of 16-channel blocks


def test_native_integer_gemm_refuses_a_path_this_cpu_lacks_and_wrong_shapes():
    paths = native_paths()
    if not paths:
        pytest.skip("no native integer GEMM in this build or on this CPU")
    ops = native_op("w8a8_linear")
    layer = W8A8Linear(torch.randn(64, 128))
    args = (layer.weight, layer.weight_scales, layer.compensation)
    with pytest.raises(RuntimeError, match="path must be"):
        ops.w8a8_linear(torch.randn(8, 128), *args, torch.empty(8, 64), "sse")
    if "amx" not in paths:
        with pytest.raises(RuntimeError, match="path must be"):
            ops.w8a8_linear(torch.randn(8, 128), *args, torch.empty(8, 64), "amx")
    with pytest.raises(RuntimeError, match="shapes differ"):
        ops.w8a8_linear(torch.randn(8, 192), *args, torch.empty(8, 64))


MODEL_DIR = Path("models/SmolLM2-135M-Instruct")


def prompt_logits(quantization: str, dtype: str, tokens: list[int]) -> torch.Tensor:
    """Every position's logits for one prompt, one prefill step through the engine's runner."""
    model = load_model(str(MODEL_DIR), dtype, "cpu", len(tokens) + 16, "auto", quantization)
    runner = ModelRunner(model, len(tokens) // 16 + 4, 16)
    config = SchedulerConfig(
        max_num_seqs=1, max_num_batched_tokens=len(tokens), max_model_len=len(tokens) + 16
    )
    scheduler = Scheduler(config, BlockManager(len(tokens) // 16 + 4, 16, False))
    scheduler.add_request(
        Request("r", tokens, SamplingParams(max_tokens=1, temperature=0.0), None, max_tokens=1)
    )
    return runner.all_logits(scheduler.schedule())[1]


@pytest.mark.skipif(not (MODEL_DIR / "config.json").exists(), reason="model not fetched (make model)")
def test_the_bundled_model_in_w8a8_predicts_what_bfloat16_does():
    """The real model's w8a8 layers (the project's GEMM where built, on a 256-row prefill) against its
    bfloat16 ones on a passage of the tune text: the same next token almost everywhere, and a mean negative
    log-likelihood within 5% (perplexity is measured by bench/quant_study.py)."""
    from transformers import AutoTokenizer

    text = Path("bench/data/quant_tune.txt").read_text()
    tokens = AutoTokenizer.from_pretrained(MODEL_DIR).encode(text, add_special_tokens=False)[:256]
    reference, quantized = (
        prompt_logits("none", "bfloat16", tokens),
        prompt_logits("w8a8", "bfloat16", tokens),
    )
    agreement = (reference.argmax(-1) == quantized.argmax(-1)).float().mean()
    targets = torch.tensor(tokens[1:])

    def nll(logits: torch.Tensor) -> float:
        return float(-torch.log_softmax(logits[:-1], -1).gather(1, targets[:, None]).mean())

    assert agreement >= 0.9, f"top-1 agreement {agreement:.2f}"
    assert abs(nll(quantized) / nll(reference) - 1) < 0.05
