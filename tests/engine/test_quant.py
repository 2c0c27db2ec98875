"""Weight-only int8/int4 linear layers and GGUF 4-bit loading (worker/model/quant.py, worker/model/gguf.py).

Tolerances: torch's kernels run in bfloat16 (8 bits of mantissa, relative rounding 2^-9 per element), so a
layer is compared with F.linear over its own de-quantized weights at a relative error of 1%; the
quantization error itself is bounded per weight (half a step of its channel or group).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

from tests.engine.factories import tiny_llama
from tests.engine.kernel_grid import int8_rows_on_grid, on_chunk_grid
from worker.kernels import native_ops
from worker.model.cpu_kind import auto_choice, cpu_info
from worker.model.gguf import decode_q4_blocks, load_int4_groups, read_gguf_tensors, undo_rotary_permutation
from worker.model.loader import has_4bit_blocks, resolve_dtype, resolve_quantization
from worker.model.model import LlamaForPagedAttention
from worker.model.quant import Int4Groups, Int4Linear, Int8Linear, build_linear, native_cpu_bfloat16
from worker.model.w4a8 import w4a8_available
from worker.model.w8a8 import w8a8_available


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm())


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_int8_layer_computes_x_times_its_dequantized_weight(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    layer = Int8Linear(weight, bias)
    dequantized = layer.weight.float() * layer.scales.float()[:, None]
    # symmetric rounding: at most half a step (its row's max |w| / 127, as stored) per weight
    step = layer.scales.float()[:, None]
    assert bool(((dequantized - weight).abs() <= step / 2 + 1e-6).all())
    x = torch.randn(rows, 64, generator=gen)
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 96)
    assert relative_error(got, F.linear(x, dequantized, bias)) < 1e-2


@pytest.mark.parametrize("in_features", [64, 40, 33, 1536])  # 16-wide steps, tails, an odd width, the MLP's
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 10, 16, 17, 33])  # row tiles; the panel GEMM's blocks
def test_native_int8_kernel_is_x_times_dequantized_weight(rows, in_features):
    """float32 x below `bf16_panel_min_rows` rows (on a 16-bit grid per 64 elements: one row where the CPU
    has AVX512-VNNI, every row on an AVX2 build without it), x rounded to bfloat16 from there
    (bf16_panel_gemm.h: the int8 codes are exact in bfloat16 and the scale multiplies the float32 sums)."""
    ops = native_ops()
    if ops is None:
        pytest.skip("native kernels not built (make kernels)")
    gen = torch.Generator().manual_seed(rows * 1000 + in_features)
    weight = torch.randn(200, in_features, generator=gen)  # 200 channels: uneven split over threads
    layer = Int8Linear(weight)
    assert layer.backend == "native-int8" and layer.scales.dtype == torch.float32
    x = torch.randn(rows, in_features, generator=gen)
    panel_rows = ops.bf16_panel_min_rows()
    read = x.bfloat16().double() if 0 < panel_rows <= rows else x.double()
    on_grid = int8_rows_on_grid(rows)
    if on_grid:
        read = on_chunk_grid(read)
    expected = read @ (layer.weight.double() * layer.scales.double()[:, None]).T
    got = torch.empty(rows, 200)
    ops.int8_linear(x, layer.weight, layer.scales, got)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)
    if on_grid:  # the grid's own error: at most a step, its row's max |x| 2^-14, per element
        dequantized = layer.weight.double() * layer.scales.double()[:, None]
        error = (got.double() - x.double() @ dequantized.T).abs()
        row_max = x.abs().amax(dim=1, keepdim=True).double()
        assert bool((error <= row_max * 2.0**-14 * dequantized.abs().sum(1) + 1e-6).all())
    # a bfloat16 model feeds bfloat16 rows and gets bfloat16 back
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_int8_rows_on_the_grid_get_what_each_gets_alone_and_the_float_path_stays_behind_a_switch():
    """An AVX2 build without AVX512-VNNI runs every batch below the dequantizing rows on the 16-bit grid
    (int8_linear.cpp `grid_rows_avx2`): each row's result is the one it gets alone, bit for bit, whatever the
    batch; `set_int8_grid_max_rows(1)` holds batches of 2 or more on the float path, which reads x as is."""
    ops = native_ops()
    if ops is None or ops.int8_grid_max_rows() < 2:
        pytest.skip("not an AVX2 build without AVX512-VNNI: batches do not run on the grid here")
    gen = torch.Generator().manual_seed(21)
    layer = Int8Linear(torch.randn(80, 200, generator=gen))
    x = torch.randn(9, 200, generator=gen) * torch.rand(9, 1, generator=gen) * 10
    batch = torch.empty(9, 80)
    ops.int8_linear(x, layer.weight, layer.scales, batch)
    for row in range(9):
        alone = torch.empty(1, 80)
        ops.int8_linear(x[row : row + 1].contiguous(), layer.weight, layer.scales, alone)
        assert torch.equal(batch[row], alone[0])
    before = ops.int8_grid_max_rows()
    ops.set_int8_grid_max_rows(1)
    try:
        floats = torch.empty(9, 80)
        ops.int8_linear(x, layer.weight, layer.scales, floats)
    finally:
        ops.set_int8_grid_max_rows(before)
    dequantized = layer.weight.double() * layer.scales.double()[:, None]
    torch.testing.assert_close(floats.double(), x.double() @ dequantized.T, rtol=1e-5, atol=1e-4)
    assert not torch.equal(floats, batch)


def test_auto_quantization_is_this_cpu_kinds_choice_where_its_kernel_runs_else_none(tmp_path):
    """Each kind's choice has its own test (tests/unit/test_cpu_kind.py); here the machine at hand's, for a
    model directory whose GGUF file holds its 4-bit blocks (what w4a8 computes)."""
    runs = {
        "none": True,
        "int8": native_ops() is not None and hasattr(native_ops(), "int8_linear"),
        "w8a8": w8a8_available(torch.device("cpu")),
        "w4a8": w4a8_available(torch.device("cpu")),
    }
    chosen = auto_choice(cpu_info().kind).quantization
    if chosen == "w4a8" and not runs["w4a8"]:
        chosen = "w8a8"
    model_dir = gguf_model_dir(tmp_path, GGMLQuantizationType.Q4_1)
    assert resolve_quantization("auto", "cpu", model_path=model_dir) == (chosen if runs[chosen] else "none")
    assert resolve_quantization("auto", "cuda:0") == "none"
    assert resolve_quantization("int4", "cpu") == "int4"


def gguf_model_dir(tmp_path, layer_type) -> str:
    """A model directory keeping a GGUF file whose two layer weights are of `layer_type` (and a norm)."""
    from gguf import GGUFWriter

    weight = np.random.default_rng(2).normal(size=(16, 64)).astype(np.float32)
    blocks = layer_type == GGMLQuantizationType.Q4_1
    tmp_path.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(tmp_path / "model.gguf"), "llama")
    data, raw_dtype = (q4_1_bytes(weight), layer_type) if blocks else (weight, None)
    for name in ("blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"):
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(tmp_path)


def test_auto_takes_w4a8_only_for_a_model_whose_gguf_file_holds_its_4_bit_blocks(tmp_path):
    """On a kind whose choice is w4a8, a model without Q4 blocks (none kept, or layers of another type) gets
    w8a8: 4-bit weights quantized from float are not what was measured."""
    blocks = gguf_model_dir(tmp_path / "q4", GGMLQuantizationType.Q4_1)
    floats = gguf_model_dir(tmp_path / "f32", GGMLQuantizationType.F32)
    (tmp_path / "none").mkdir()
    assert has_4bit_blocks(blocks) and not has_4bit_blocks(floats)
    assert not has_4bit_blocks(str(tmp_path / "none")) and not has_4bit_blocks(None)
    w4a8, w8a8 = w4a8_available(torch.device("cpu")), w8a8_available(torch.device("cpu"))
    fallback = "w8a8" if w8a8 else "none"
    assert resolve_quantization("auto", "cpu", "avx2", blocks) == ("w4a8" if w4a8 else fallback)
    for other in (floats, str(tmp_path / "none"), None):
        assert resolve_quantization("auto", "cpu", "avx2", other) == fallback
    assert resolve_quantization("w4a8", "cpu", "avx2", floats) == "w4a8"  # an explicit choice stands


def test_weight_only_quantized_weights_run_float32_activations_on_cpu_unless_asked_otherwise():
    assert resolve_dtype("auto", "cpu", "int8") == "float32"
    assert resolve_dtype("auto", "cpu", "int4") == "float32"
    # w8a8 and w4a8 quantize their rows whatever their dtype: the kind's own dtype, as unquantized weights
    assert resolve_dtype("auto", "cpu", "w8a8") == resolve_dtype("auto", "cpu", "none")
    assert resolve_dtype("auto", "cpu", "w4a8") == resolve_dtype("auto", "cpu", "none")
    assert resolve_dtype("auto", "cpu", "none") == ("bfloat16" if native_cpu_bfloat16() else "float32")
    assert resolve_dtype("bfloat16", "cpu", "int8") == "bfloat16"  # an explicit choice stands


@pytest.mark.parametrize("rows", [1, 7, 40])
def test_int4_layer_computes_x_times_its_dequantized_weight(rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(80, 128, generator=gen)
    groups = Int4Groups.from_float(weight)
    # min/max rounding: at most half a step of its group per weight
    step = groups.scales.repeat_interleave(32, dim=1)
    assert bool(((groups.dequantize() - weight).abs() <= step / 2 + 1e-5).all())
    x = torch.randn(rows, 128, generator=gen).bfloat16()
    got = Int4Linear(weight.bfloat16(), groups=groups)(x)
    assert got.dtype == torch.bfloat16
    assert relative_error(got, F.linear(x.float(), groups.dequantize())) < 1e-2


def test_int4_refuses_widths_that_are_not_whole_groups_and_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Groups.from_float(torch.randn(8, 48))
    with pytest.raises(ValueError, match="unknown quantization"):
        build_linear(torch.randn(8, 32), None, "auto", "int3")


def q4_1_bytes(weight: np.ndarray) -> np.ndarray:
    """llama.cpp's Q4_1 encoding of float rows, written by the gguf package (not by the code under test)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(weight, GGMLQuantizationType.Q4_1)


def test_q4_1_blocks_decode_to_what_the_gguf_package_dequantizes():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    weight = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    raw = q4_1_bytes(weight)
    expected = dequantize(raw, GGMLQuantizationType.Q4_1)
    groups = decode_q4_blocks(raw, "Q4_1")
    assert groups.codes.shape == (6, 96) and int(groups.codes.max()) <= 15
    np.testing.assert_allclose(groups.dequantize().numpy(), expected, rtol=0, atol=1e-5)


def test_rotary_row_permutation_is_undone_like_transformers_does():
    heads, rows = 3, 12
    weight = torch.arange(rows * 32, dtype=torch.float32).reshape(rows, 32)
    # llama.cpp's converter: [heads, 2, half, K] -> [heads, half, 2, K]
    permuted = weight.reshape(heads, 2, rows // heads // 2, 32).transpose(1, 2).reshape(rows, 32)
    groups = Int4Groups(
        torch.zeros(rows, 32, dtype=torch.uint8), permuted[:, :1].clone(), permuted[:, :1].clone()
    )
    restored = undo_rotary_permutation(groups, heads)
    assert torch.equal(restored.scales, weight[:, :1])


def test_gguf_file_blocks_load_by_hugging_face_name_and_mismatches_are_skipped(tmp_path):
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(1)
    up, gate = rng.normal(size=(16, 64)).astype(np.float32), rng.normal(size=(16, 64)).astype(np.float32)
    path = str(tmp_path / "tiny.gguf")
    writer = GGUFWriter(path, "llama")
    writer.add_token_list([f"t{i}" for i in range(300)])  # a string array the reader must walk past
    writer.add_tensor("blk.0.ffn_up.weight", q4_1_bytes(up), raw_dtype=GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.ffn_gate.weight", q4_1_bytes(gate), raw_dtype=GGMLQuantizationType.Q4_1)
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tensors = read_gguf_tensors(path)
    assert tensors["blk.0.ffn_up.weight"].kind == "Q4_1" and tensors["blk.0.ffn_up.weight"].shape == (16, 64)
    float_up = decode_q4_blocks(q4_1_bytes(up), "Q4_1").dequantize()
    weights = {
        "model.layers.0.mlp.up_proj.weight": float_up,  # what a de-quantized conversion holds
        "model.layers.0.mlp.gate_proj.weight": torch.from_numpy(gate),  # not the file's values
    }
    groups = load_int4_groups(path, weights, num_heads=1, num_kv_heads=1)
    assert list(groups) == ["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(groups["model.layers.0.mlp.up_proj.weight"].dequantize(), float_up)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_model_logits_stay_close_to_float(quantization):
    """A whole tiny model: every linear layer and the LM head quantized, logits within a few percent."""
    hf = tiny_llama()
    float_model = LlamaForPagedAttention(hf, 64)
    quantized = LlamaForPagedAttention(hf, 64, quantization=quantization)
    kind = Int8Linear if quantization == "int8" else Int4Linear
    assert all(type(layer.gate_up) is kind for layer in quantized.layers)
    if quantization == "int4" and hasattr(native_ops() or object(), "int4_linear"):
        assert all(layer.gate_up.backend == "native-int4" for layer in quantized.layers)
    assert isinstance(quantized.lm_head, Int8Linear)  # 8-bit head in both modes
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    layer_f, layer_q = float_model.layers[0], quantized.layers[0]
    for name in ("qkv", "o_proj", "down"):
        width = getattr(layer_f, name).in_features
        x = hidden.repeat(1, width // 64 + 1)[:, :width]
        bound = 0.03 if quantization == "int8" else 0.15  # int4: 16 levels per group of 32
        assert relative_error(getattr(layer_q, name)(x), getattr(layer_f, name)(x)) < bound


def collect_logits(
    model: LlamaForPagedAttention, prompts: list[list[int]], budget: int, prefix_caching: bool
):
    """Greedy-decode prompts through scheduler + paged runner; per request, logits at every position."""
    from tests.engine.factories import make_request, make_scheduler
    from worker.model.runner import ModelRunner

    scheduler = make_scheduler(
        num_blocks=128, block_size=4, max_num_batched_tokens=budget, prefix_caching=prefix_caching
    )
    runner = ModelRunner(model, 128, 4)
    requests = [make_request(prompt=p, max_tokens=5) for p in prompts]
    for r in requests:
        scheduler.add_request(r)
    out = {r.request_id: {} for r in requests}
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        items, logits = runner.all_logits(plan)
        row, sampled = 0, {}
        for item in items:
            for offset in range(item.num_new_tokens):
                out[item.request.request_id][item.start + offset] = logits[row + offset]
            if item.samples:
                sampled[item.request.request_id] = int(logits[row + item.num_new_tokens - 1].argmax())
            row += item.num_new_tokens
        scheduler.update_from_output(plan, sampled)
    return [out[r.request_id] for r in requests]


@pytest.fixture
def held_path(request):
    """Every decoder linear of a model held on one of its kernels' paths at every row count, where the engine
    switches by rows: the native kernels' row-at-a-time products ("rows"; int4 on a build without AVX512-BF16
    runs its float32 panel from 5 rows either way, int4_linear.cpp), their bfloat16 panel GEMM
    ("panel", worker/kernels/bf16_panel_gemm.h, AVX512-BF16 builds), or dequantize + oneDNN bfloat16 GEMM
    ("dequantized", worker/model/quant.py). Yields a function that holds a model there; the switch is
    restored."""
    ops = native_ops()
    path = request.param
    if ops is None and path != "rows":
        pytest.skip("native kernels not built (make kernels)")
    if path == "panel" and ops.bf16_panel_min_rows() == 0:
        pytest.skip("this build has no bfloat16 panel GEMM (no AVX512-BF16)")
    before = ops.bf16_panel_min_rows() if ops is not None else 0
    if before:
        ops.set_bf16_panel_min_rows(1 if path == "panel" else 10**9)

    def hold(model: LlamaForPagedAttention) -> None:
        for layer in model.layers:
            for role in ("qkv", "o_proj", "gate_up", "down"):
                getattr(layer, role).dequantize_from = 1 if path == "dequantized" else None

    yield hold
    if before:
        ops.set_bf16_panel_min_rows(before)


@pytest.mark.parametrize("held_path", ["rows", "panel", "dequantized"], indirect=True)
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_model_through_the_paged_engine_matches_one_sequence_at_a_time(quantization, held_path):
    """Batching, chunked prefill and prefix-cache hits change nothing but the order of work: the paged
    run's logits equal each sequence run alone in one prefill (bfloat16 kernels: 1e-2). Each path is held
    for both runs: across a switch, bfloat16 rounding can flip a near tie of this random model's greedy
    token, after which the sequences differ."""
    model = LlamaForPagedAttention(tiny_llama(), 64, quantization=quantization)
    held_path(model)
    shared = [(5 * i + 1) % 200 + 1 for i in range(16)]
    prompts = [shared + [7, 9, 11], shared + [3], [(3 * i + 2) % 200 + 1 for i in range(21)]]
    alone = [collect_logits(model, [p], budget=64, prefix_caching=False)[0] for p in prompts]
    paged = collect_logits(model, prompts, budget=8, prefix_caching=True)
    for got, expected in zip(paged, alone, strict=True):
        positions = sorted(got)  # prefix-cache hits skip the shared prompt's positions
        assert positions[-1] == max(expected)
        torch.testing.assert_close(
            torch.stack([got[p] for p in positions]),
            torch.stack([expected[p] for p in positions]),
            rtol=1e-2,
            atol=1e-2,
        )
