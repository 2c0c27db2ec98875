"""int8 weights x int8 activations (worker/model/w8a8.py) and the smoothing in front of them
(worker/model/smoothing.py), on small random layers and a tiny random Llama."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.engine.factories import tiny_llama
from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.kernels import native_op, native_ops
from worker.model.cpu_kind import cpu_info
from worker.model.loader import load_model
from worker.model.model import LlamaForPagedAttention
from worker.model.quant import Int8Linear, native_cpu_bfloat16
from worker.model.runner import ModelRunner
from worker.model.smoothing import activation_ranges, factors, smooth
from worker.model.w8a8 import (
    GROUP,
    ZERO_POINT,
    W8A8Linear,
    quantize_rows,
    row_max_code,
    w8a8_available,
)

# w8a8 runs only on the project's integer GEMM: a build with the kernels on a CPU with AVX512-VNNI or AVX2
# (test_the_integer_gemm_is_built_where_the_cpu_has_integer_dot_products: it is there when it should be).
needs_gemm = pytest.mark.skipif(
    not w8a8_available(torch.device("cpu")),
    reason="no integer GEMM here (make kernels; AVX512-VNNI or AVX2)",
)


def gemm_or_skip():
    """The compiled integer GEMM, or a skip where this build or CPU has none (before `make kernels`, or a
    CPU without AVX512-VNNI or AVX2)."""
    ops = native_op("w8a8_linear")
    if ops is None or not ops.w8a8_linear_supported():
        pytest.skip("no native integer GEMM in this build or on this CPU")
    return ops


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm())


def test_rows_quantize_to_symmetric_codes_with_one_scale_per_group_of_columns():
    x = torch.zeros(3, 2 * GROUP)
    x[0, :3] = torch.tensor([1.0, -2.0, 0.5])
    x[0, GROUP : GROUP + 2] = torch.tensor([300.0, -3.0])  # the second group's own scale: 300 / 127
    x[2, :] = 5.0
    codes, scales = quantize_rows(x)
    assert codes.dtype == torch.uint8 and scales.shape == (3, 2)
    signed = codes.int() - ZERO_POINT
    assert signed.abs().max() <= 127
    assert signed[0, :3].tolist() == [64, -127, 32]  # -2 is the group's largest: -127; 1 -> 63.5 -> 64 (even)
    assert signed[0, GROUP : GROUP + 2].tolist() == [127, -1]  # -3 on the 300 scale
    assert signed[1].abs().sum() == 0  # an all-zero row stays zero (no division by zero)
    assert signed[2].tolist() == [127] * 2 * GROUP
    torch.testing.assert_close(scales[0], torch.tensor([2.0, 300.0]) / 127)
    step = scales.repeat_interleave(GROUP, dim=1)
    torch.testing.assert_close(signed.float() * step, x, atol=float(scales.max()) / 2, rtol=0)


@needs_gemm
@pytest.mark.parametrize("rows", [1, 5, 17, 64])
def test_w8a8_layer_is_its_integer_products_and_close_to_the_float_layer(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 192, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 192, generator=gen)
    layer = W8A8Linear(weight, bias)
    got = layer(x)
    torch.testing.assert_close(got.double(), layer.reference(x), rtol=1e-5, atol=1e-4)
    assert relative_error(got, x @ weight.T + bias) < 0.02  # at most two 8-bit roundings
    assert layer(x.bfloat16()).dtype == torch.bfloat16


@needs_gemm
def test_one_scale_per_group_keeps_a_row_with_an_outlier_accurate():
    """Why the scales are per group: one large activation (as a few channels of a trained model's rows
    have) sets the step of its own group only, so the row's other groups keep their 8 bits; with one scale
    per row they would round to a few levels."""
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(64, 4 * GROUP, generator=gen)
    x = torch.randn(8, 4 * GROUP, generator=gen)
    x[:, 3] = 200.0  # an outlier in the first group of every row
    weight[:, :GROUP] = 0.0  # the output is the other groups' alone
    layer = W8A8Linear(weight)
    weights = layer.weight_codes() * layer.weight_scales[:, None]
    exact_rows = x @ weights.T  # the 8-bit weights against the rows as they are: the rows' rounding alone
    row_scale = x.abs().amax(dim=1, keepdim=True) / 127
    one_scale_per_row = (torch.round(x / row_scale) * row_scale) @ weights.T
    assert relative_error(layer(x), exact_rows) < relative_error(one_scale_per_row, exact_rows) / 4


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


def test_activation_ranges_are_kept_in_the_model_directory_for_the_next_start(tmp_path, monkeypatch):
    """The calibration pass is most of smoothing's cost: a second start with the same weights and tokens reads
    the ranges back (the same values); other tokens, or rewritten weights, compute them again."""
    from worker.model import smoothing

    hf = tiny_llama(num_attention_heads=4, num_key_value_heads=2)
    hf.save_pretrained(tmp_path)
    ids = [(5 * i + 1) % 250 + 1 for i in range(30)]
    computed = []
    compute = smoothing.activation_ranges
    monkeypatch.setattr(smoothing, "activation_ranges", lambda m, t: computed.append(1) or compute(m, t))
    first = smoothing.cached_activation_ranges(hf, ids, str(tmp_path))
    again = smoothing.cached_activation_ranges(hf, ids, str(tmp_path))
    assert len(computed) == 1 and first.keys() == again.keys()
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert first.keys() == activation_ranges(hf, ids).keys()
    smoothing.cached_activation_ranges(hf, ids[:-1], str(tmp_path))
    assert len(computed) == 2
    hf.save_pretrained(tmp_path)  # the weight file rewritten: size or modification time differs
    weights = next(tmp_path.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    smoothing.cached_activation_ranges(hf, ids, str(tmp_path))
    assert len(computed) == 3
    cached = sorted((tmp_path / smoothing.RANGES_CACHE_DIR).iterdir())
    assert len(cached) == 3 and not [f for f in cached if f.suffix == ".tmp"]


def test_activation_ranges_are_computed_where_the_model_directory_is_read_only(tmp_path, monkeypatch):
    from worker.model import smoothing

    hf = tiny_llama()
    hf.save_pretrained(tmp_path)
    (tmp_path / smoothing.RANGES_CACHE_DIR).write_text("a file where the cache directory would be")
    ids = list(range(1, 20))
    ranges = smoothing.cached_activation_ranges(hf, ids, str(tmp_path))
    assert all(torch.equal(ranges[key], value) for key, value in activation_ranges(hf, ids).items())


def _spread(ranges: dict) -> float:
    """Largest over typical channel range of the q/k/v and gate/up inputs, the worst layer."""
    return max(float(r.max() / r.median()) for (_, role), r in ranges.items() if role in ("qkv", "gate_up"))


def test_factors_balance_activation_and_weight_ranges():
    s = factors(torch.tensor([100.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 2.0]))
    torch.testing.assert_close(s, torch.tensor([10.0, 1.0, 1.0]))  # a channel that never moved stays


@needs_gemm
def test_w8a8_model_holds_int8_products_in_every_decoder_linear_and_stays_close_to_float():
    hf = tiny_llama()
    float_model = LlamaForPagedAttention(hf, 64)
    quantized = LlamaForPagedAttention(hf, 64, quantization="w8a8")
    roles = ("qkv", "o_proj", "gate_up", "down")
    assert all(type(getattr(layer, role)) is W8A8Linear for layer in quantized.layers for role in roles)
    assert (type(quantized.lm_head) is W8A8Linear) == (row_max_code() < 127)  # its rows: AVX2 only
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    for role in roles:
        layer_f, layer_q = getattr(float_model.layers[0], role), getattr(quantized.layers[0], role)
        x = hidden.repeat(1, layer_f.in_features // 64 + 1)[:, : layer_f.in_features]
        assert relative_error(layer_q(x), layer_f(x)) < 0.03


@needs_gemm
def test_the_head_of_a_float32_w8a8_model_quantizes_its_rows_on_the_avx2_gemm_and_each_row_alone():
    """On the AVX2 kernel the head is a w8a8 layer, and a row's logits are the same in any batch (a prompt's
    logprobs equal the sampled token's); on VNNI builds it keeps float rows on int8 weights."""
    hf = tiny_llama()
    head = LlamaForPagedAttention(hf, 64, quantization="w8a8").lm_head
    if row_max_code() == 127:  # the VNNI kernel: not measured for the head, so not used there
        assert type(head) is Int8Linear
        return
    assert type(head) is W8A8Linear
    hidden = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))
    weight = hf.lm_head.weight.detach()
    logits = head(hidden)
    torch.testing.assert_close(logits.double(), head.reference(hidden), rtol=1e-5, atol=1e-4)
    assert relative_error(logits, hidden @ weight.T) < 0.03
    for rows in (1, 2, 4, 5, 6, 7):  # every tile height of the kernel, and the rows' order
        assert torch.equal(head(hidden[:rows]), logits[:rows])
        assert torch.equal(head(hidden[rows - 1 : rows + 2]), logits[rows - 1 : rows + 2])
    # a vocabulary of partial channel blocks keeps the int8 head (the decoder layers are w8a8 all the same)
    odd = LlamaForPagedAttention(tiny_llama(vocab_size=250), 64, quantization="w8a8")
    assert type(odd.lm_head) is Int8Linear and type(odd.layers[0].qkv) is W8A8Linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_group_quantization_equals_the_torch_steps(dtype):
    ops = native_op("quantize_rows_u8")
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    x = (torch.randn(37, 3 * GROUP, generator=torch.Generator().manual_seed(3)) * 5).to(dtype)
    x[4] = 0.0
    x[5] = 0.0  # scale 2: the halves 0.5, 1.5, 2.5, -0.5, -1.5 round to even (0, 2, 2, 0, -2)
    x[5, :6] = torch.tensor([254.0, 1.0, 3.0, 5.0, -1.0, -3.0])
    codes, scales = torch.empty(x.shape, dtype=torch.uint8), torch.empty(37, 3)
    ops.quantize_rows_u8(x, codes, scales)
    expected_codes, expected_scales = quantize_rows(x)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)
    assert (codes[5, :6].int() - ZERO_POINT).tolist() == [127, 0, 2, 2, 0, -2]
    # the AVX2 GEMM's 7-bit codes: the same steps with 63 levels a side, one scale per 32 columns
    scales = torch.empty(37, 6)
    ops.quantize_rows_u8(x, codes, scales, 63)
    expected_codes, expected_scales = quantize_rows(x, 63, 32)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)
    assert (codes.int() - ZERO_POINT).abs().max() == 63
    with pytest.raises(RuntimeError, match="max_code"):
        ops.quantize_rows_u8(x, codes, scales, 128)
    # groups of any width that divides the row (here 67 columns: the eight-wide loop and its scalar tail)
    odd = (torch.randn(37, 201, generator=torch.Generator().manual_seed(4)) * 5).to(dtype)
    odd_codes = torch.empty(37, 201, dtype=torch.uint8)
    one_per_row, per_group = torch.empty(37, 1), torch.empty(37, 3)
    ops.quantize_rows_u8(odd, odd_codes, per_group)
    assert torch.equal(per_group, odd.float().reshape(37, 3, 67).abs().amax(dim=2) / 127)
    ops.quantize_rows_u8(odd, odd_codes, one_per_row)
    assert torch.equal(one_per_row[:, 0], per_group.amax(dim=1))
    with pytest.raises(RuntimeError, match="groups dividing the row"):
        ops.quantize_rows_u8(odd, odd_codes, torch.empty(37, 2))


def test_the_integer_gemm_is_built_where_the_cpu_has_integer_dot_products():
    """A build for a CPU with AVX512-VNNI (AMX CPUs among them) or AVX2 has the integer GEMM: a build that
    loses the kernel fails here instead of leaving w8a8 refused at start unnoticed. Its rows' codes are 8-bit
    on VNNI and 7-bit on AVX2 (where two steps' 16-bit pair sums must not overflow), there with a scale per 32
    columns."""
    ops = native_ops()
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    flags = cpu_info().flags
    vnni = "avx512_vnni" in flags  # (cpu_info keeps only ISA_FLAGS: every CPU with VNNI has AVX512-BW too)
    assert hasattr(ops, "w8a8_linear") and ops.w8a8_linear_supported() == (vnni or "avx2" in flags)
    assert ops.w8a8_row_max_code() == (127 if vnni else 63)
    assert ops.w8a8_row_group() == (64 if vnni else 32)  # AVX2's 7-bit codes take a scale per 32 columns


def test_packed_weight_is_the_codes_in_groups_of_four_columns_per_sixteen_channels():
    ops = native_op("w8a8_pack_weight")
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    codes = torch.randint(-127, 128, (64, 128), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    packed, compensation = torch.empty(4, 32, 64, dtype=torch.int8), torch.empty(2, 64, dtype=torch.int32)
    ops.w8a8_pack_weight(codes, packed, compensation)
    # packed[b, q, 4 c + i] = codes[16 b + c, 4 q + i]
    expected = codes.reshape(4, 16, 32, 4).permute(0, 2, 1, 3).reshape(4, 32, 64)
    assert torch.equal(packed, expected)
    # compensation[g, n]: -128 times channel n's code sum over group g's 64 columns (where its sums start)
    group_sums = codes.int().reshape(64, 2, GROUP).sum(dim=2, dtype=torch.int32).T
    assert torch.equal(compensation, -128 * group_sums)


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 16, 17, 33, 64, 130])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_native_integer_gemm_is_the_exact_integer_sums_scaled(rows, out_dtype):
    """The kernel (chunks of 4 rows and 64 channels; the row counts reach every remainder) gives each group's
    exact int32 sums of the row codes against the weight codes, times the group's scale, added up group after
    group in float32, times the channel scale, rounded once to the output dtype. The scales here are powers
    of two and the sums small integers, so every one of those float32 steps is exact and the kernel must give
    the exact result, bit for bit."""
    ops = gemm_or_skip()
    gen = torch.Generator().manual_seed(rows)
    n, k = 96, 576  # 6 channel blocks (passes of 3 on two threads, of 4 and 2 on one); 9 groups of columns
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    codes[:, 0] = 127  # so each channel's scale is its power of two
    weight = codes.float() * 2.0 ** torch.randint(-3, 3, (n, 1), generator=gen)
    layer = W8A8Linear(weight)
    assert torch.equal(layer.weight_codes(), codes)
    # each group's largest |x| is the row code limit times a power of two, the others small multiples of that
    # power (so the sums of all 9 groups stay within float32's 24 bits)
    group = layer.row_group
    powers = 2.0 ** torch.randint(-2, 2, (rows, k // group), generator=gen)
    x = torch.randint(-7, 8, (rows, k), generator=gen).float()
    x[:, ::group] = float(layer.row_max_code)  # the group's scale: its power of two
    x = x * powers.repeat_interleave(group, dim=1)
    x[0, :] = 0.0  # an all-zero row: scale 1e-12 / 127, codes 128, sums exactly zero after the compensation
    expected = layer.reference(x)
    assert torch.equal(expected, expected.float().double())  # the reference itself exact in float32
    out = torch.empty(rows, n, dtype=out_dtype)
    ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, out)
    assert torch.equal(out, expected.to(out_dtype))
    assert torch.equal(out[0], torch.zeros(n, dtype=out_dtype))


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_native_integer_gemm_matches_the_reference_on_real_valued_rows(rows):
    """Arbitrary scales: the float32 sums of the groups round differently from float64's, within float32
    rounding of a sum of 9 terms."""
    ops = gemm_or_skip()
    gen = torch.Generator().manual_seed(rows)
    layer = W8A8Linear(torch.randn(96, 576, generator=gen))
    x = torch.randn(rows, 576, generator=gen) * torch.rand(rows, 576, generator=gen) * 10
    out = torch.empty(rows, 96)
    ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, out)
    torch.testing.assert_close(out.double(), layer.reference(x), rtol=1e-5, atol=1e-4)


def test_native_integer_gemm_reads_bfloat16_rows_as_their_float32_values():
    ops = gemm_or_skip()
    gen = torch.Generator().manual_seed(5)
    layer = W8A8Linear(torch.randn(64, 128, generator=gen))
    x = torch.randn(9, 128, generator=gen).bfloat16()
    from_bf16, from_f32 = torch.empty(9, 64), torch.empty(9, 64)
    ops.w8a8_linear(x, layer.weight, layer.weight_scales, layer.compensation, from_bf16)
    ops.w8a8_linear(x.float(), layer.weight, layer.weight_scales, layer.compensation, from_f32)
    assert torch.equal(from_bf16, from_f32)


@needs_gemm
def test_w8a8_layer_keeps_only_the_packed_codes_and_refuses_shapes_of_partial_groups():
    weight = torch.randn(64, 128)
    layer = W8A8Linear(weight)
    assert layer.backend == "native-w8a8" and layer.compensation.shape == (128 // GROUP, 64)
    codes = torch.round(weight / layer.weight_scales[:, None]).clamp(-127, 127).to(torch.int8)
    assert torch.equal(layer.weight_codes(), codes)  # read back from the kernel's layout
    assert layer(torch.randn(0, 128).bfloat16()).shape == (0, 64)  # an empty batch: an empty result
    with pytest.raises(ValueError, match="multiple of 64"):
        W8A8Linear(torch.randn(64, 160))  # 160 columns: not whole groups of 64
    with pytest.raises(ValueError, match="multiple of 64"):
        W8A8Linear(torch.randn(48, 128))  # 48 channels: not whole pairs of 16-channel blocks


def test_w8a8_says_what_it_needs_where_the_integer_gemm_is_missing(monkeypatch):
    from worker.model import w8a8

    monkeypatch.setattr(w8a8, "native_op", lambda name: None)  # a build without the kernels
    assert not w8a8.w8a8_available(torch.device("cpu"))
    with pytest.raises(ValueError, match="AVX512-VNNI or AVX2"):
        w8a8.W8A8Linear(torch.randn(64, 128))


def test_native_integer_gemm_refuses_wrong_shapes():
    ops = gemm_or_skip()
    layer = W8A8Linear(torch.randn(64, 128))
    args = (layer.weight, layer.weight_scales, layer.compensation)
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


@needs_gemm
@pytest.mark.skipif(not (MODEL_DIR / "config.json").exists(), reason="model not fetched (make model)")
def test_the_bundled_model_in_w8a8_predicts_what_the_unquantized_one_does():
    """The real model's w8a8 layers (the project's GEMM, on a 256-row prefill) against its unquantized ones
    in the dtype this CPU computes natively (bfloat16 where oneDNN has it, else float32: on AVX2 emulated
    bfloat16 took this test 30 s) on a passage of the tune text: the same next token almost everywhere, and a
    mean negative log-likelihood within 5% (perplexity is measured by bench/quant_study.py)."""
    dtype = "bfloat16" if native_cpu_bfloat16() else "float32"
    agreement, nll_ratio = against_unquantized("w8a8", dtype)
    assert agreement >= 0.9, f"top-1 agreement {agreement:.2f}"
    assert abs(nll_ratio - 1) < 0.05


def against_unquantized(quantization: str, dtype: str) -> tuple[float, float]:
    """On the first 256 tokens of the tune text: the share of positions whose top token the quantized model
    shares with the unquantized one, and the ratio of their mean negative log-likelihoods."""
    from transformers import AutoTokenizer

    text = Path("bench/data/quant_tune.txt").read_text()
    tokens = AutoTokenizer.from_pretrained(MODEL_DIR).encode(text, add_special_tokens=False)[:256]
    reference, quantized = prompt_logits("none", dtype, tokens), prompt_logits(quantization, dtype, tokens)
    targets = torch.tensor(tokens[1:])

    def nll(logits: torch.Tensor) -> float:
        return float(-torch.log_softmax(logits[:-1], -1).gather(1, targets[:, None]).mean())

    agreement = float((reference.argmax(-1) == quantized.argmax(-1)).float().mean())
    return agreement, nll(quantized) / nll(reference)
