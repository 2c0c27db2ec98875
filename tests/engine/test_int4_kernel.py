"""The native 4-bit kernel (worker/kernels/int4_linear.cpp) and its wiring in worker/model/quant.py.

Reference: float64 products over the de-quantized weights (d q + m per group, computed in float64) and x as
the kernel reads it: float32, or rounded to bfloat16 on the AVX512-BF16 path (`int4_activation_dtype`); from
`bf16_panel_min_rows` rows (worker/kernels/bf16_panel_gemm.h) the weights too are rounded to bfloat16 once;
one row, where the CPU also has AVX512-VNNI, takes that bfloat16 x to each group's 16-bit grid (integer
products; elements below ~1/256 of the group's largest round to it), and so does an AVX2 CPU without them,
from the float32 x.
The kernel sums in float32 across up to 1536 products, so the tolerance is relative to sum |x| |w| (the
scale float32 summation error grows with), not to the result.
"""

import numpy as np
import pytest
import torch

import worker.model.quant as quant
from worker.kernels import native_ops
from worker.model.gguf import decode_q4_blocks
from worker.model.quant import Int4Groups, Int4Linear, pack_int4


def native_int4():
    ops = native_ops()
    if ops is None or not hasattr(ops, "int4_linear"):
        pytest.skip("native kernels not built (make kernels)")
    return ops


def random_groups(gen: torch.Generator, n: int, k: int) -> Int4Groups:
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()  # what the kernel stores
    mins = (-torch.rand(n, k // 32, generator=gen) * 0.2).half().float()
    return Int4Groups(codes, scales, mins)


def activation_dtype() -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[torch.ops.llmserve.int4_activation_dtype()]


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    return set()


def one_row_on_grid(rows: int) -> bool:
    """A single row runs the integer one-row products (int4_linear.cpp: `grid_row` where the CPU has
    AVX512-BF16 and AVX512-VNNI, `grid_row_avx2` where it has AVX2 without them; -march=native)."""
    return rows == 1 and torch.ops.llmserve.int4_one_row_path() != "float"


def on_group_grid(x: torch.Tensor) -> torch.Tensor:
    """x (float64, bfloat16 values) as the one-row path reads it: per group of 32, on the grid of step
    2^(e - 14) where 2^e <= max |x| < 2^(e + 1), rounded to nearest even (exact for |x| >= 2^(e - 7))."""
    groups = x.reshape(x.shape[0], -1, 32)
    top = groups.abs().amax(-1, keepdim=True)
    # frexp: top = f 2^exp with f in [0.5, 1), so e = exp - 1
    step = torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent - 15)
    # a float32 x (the AVX2 path) can round to 32768 steps: held at 32767 (bfloat16 values never reach it)
    gridded = torch.where(top > 0, torch.round(groups / step).clamp(-32767, 32767) * step, groups)
    return gridded.reshape(x.shape)


def panel_rows() -> float:
    """From how many rows the kernel runs the bfloat16 panel GEMM (never, where the build has none)."""
    rows = torch.ops.llmserve.bf16_panel_min_rows()
    return rows if rows > 0 else float("inf")


def reference(x: torch.Tensor, groups: Int4Groups) -> tuple[torch.Tensor, torch.Tensor]:
    """x @ W.T in float64 over x and W as the kernel reads them, and sum |x| |W| (what float32 rounding
    error scales with)."""
    x = x.to(activation_dtype()).double()
    n, k = groups.codes.shape
    q = groups.codes.double().reshape(n, k // 32, 32)
    w = (q * groups.scales.double()[..., None] + groups.mins.double()[..., None]).reshape(n, k)
    if len(x) >= panel_rows():  # d q + m as one FMA rounds it (exact in float64), then bfloat16
        w = w.float().bfloat16().double()
    magnitude = x.abs() @ w.abs().T
    if one_row_on_grid(len(x)):  # the codes' share reads x on the grid; the mins' share sums the bfloat16 x
        dq = (q * groups.scales.double()[..., None]).reshape(n, k)
        return on_group_grid(x) @ dq.T + x @ (w - dq).T, magnitude
    return x @ w.T, magnitude


def assert_matches(got: torch.Tensor, x: torch.Tensor, groups: Int4Groups) -> None:
    expected, magnitude = reference(x, groups)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert bool(torch.isfinite(got).all())
    error = float(((got.double() - expected).abs() / magnitude).max())
    assert error < 2e-6, error


# 32: one group (less than the kernel's two-group inner block); 96 and 608: multiples of 32 but not of
# 64, so a group is left over after the inner block; 1536: the MLP's width.
@pytest.mark.parametrize("in_features", [32, 96, 608, 1536])
@pytest.mark.parametrize(
    "rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 33]
)  # every row tile, then remainders/chunks; from 10 the panel GEMM's one and several 16-row blocks
def test_native_int4_kernel_is_float32_x_times_dequantized_weight(rows, in_features):
    ops = native_int4()
    gen = torch.Generator().manual_seed(rows * 10_000 + in_features)
    groups = random_groups(gen, 200, in_features)  # 200 channels: an uneven split over threads and blocks
    packed = pack_int4(groups.codes)
    assert packed.shape == (200, in_features // 2) and packed.dtype == torch.uint8
    for _ in range(2):  # fresh inputs each call, and an output buffer the kernel must overwrite entirely
        x = torch.randn(rows, in_features, generator=gen)
        out = torch.full((rows, 200), float("nan"))
        ops.int4_linear(x, packed, groups.scales.half(), groups.mins.half(), out)
        assert_matches(out, x, groups)


# Batches from five rows on an AVX2 build without AVX512-BF16: 24 weight rows formed into a float32 panel at a
# time, met by tiles of six x rows by two weight rows; channel counts leave an odd weight row over (1, 3, 25,
# 203: a part panel, a part tile) and row counts a part tile (5, 7, 13, 40).
@pytest.mark.parametrize("out_features", [1, 3, 25, 203])
@pytest.mark.parametrize("rows", [5, 7, 13, 40])
def test_batches_over_odd_channel_and_row_counts(rows, out_features):
    ops = native_int4()
    gen = torch.Generator().manual_seed(rows * 10_000 + out_features)
    for in_features in (32, 608):
        groups = random_groups(gen, out_features, in_features)
        x = torch.randn(rows, in_features, generator=gen)
        out = torch.full((rows, out_features), float("nan"))
        ops.int4_linear(x, pack_int4(groups.codes), groups.scales.half(), groups.mins.half(), out)
        assert_matches(out, x, groups)


# One row (a decode stream): four weight rows at a time, codes 4 groups (64 bytes) at a time and scales 16
# groups at a time, so channel counts that leave 1-3 rows over and group counts that leave a part block
# (1, 3, 17, 19, 65 groups) or a part 16 (17, 19, 65); x spanning four decades within a group puts elements
# below the exact part of the grid.
@pytest.mark.parametrize("out_features", [1, 3, 7, 203])
@pytest.mark.parametrize("in_features", [32, 96, 544, 608, 2080])
def test_one_row_over_odd_channel_and_group_counts(out_features, in_features):
    ops = native_int4()
    gen = torch.Generator().manual_seed(out_features * 10_000 + in_features)
    groups = random_groups(gen, out_features, in_features)
    packed = pack_int4(groups.codes)
    for spread in (1.0, 1e4):
        x = torch.randn(1, in_features, generator=gen) * spread ** -torch.rand(1, in_features, generator=gen)
        out = torch.full((1, out_features), float("nan"))
        ops.int4_linear(x, packed, groups.scales.half(), groups.mins.half(), out)
        assert_matches(out, x, groups)


def test_on_group_grid_keeps_bfloat16_values_down_to_a_256th_of_the_largest():
    values = [3.0, 3.0 / 128, 2.0**-6, 2.0**-6 * 1.5, 2.0**-8 * 1.01]
    x = torch.tensor([values + [0.0] * 27], dtype=torch.float64)
    got = on_group_grid(x)[0, :5].tolist()  # max 3: e = 1, step 2^-13
    assert got[:4] == x[0, :4].tolist()
    assert got[4] == round(2.0**-8 * 1.01 * 2**13) * 2.0**-13 != x[0, 4]


@pytest.mark.parametrize("rows", [1, 2, 8])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_x_gives_non_finite_outputs(rows, bad):
    ops = native_int4()
    groups = random_groups(torch.Generator().manual_seed(4), 12, 96)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(5))
    x[:, 40] = bad
    out = torch.zeros(rows, 12)
    ops.int4_linear(x, pack_int4(groups.codes), groups.scales.half(), groups.mins.half(), out)
    assert not bool(torch.isfinite(out).any())


def test_the_bfloat16_path_is_taken_where_the_cpu_has_it():
    native_int4()
    flags = cpu_flags()
    has_bf16 = {"avx512_bf16", "avx512bw", "avx512vl"} <= flags
    assert torch.ops.llmserve.int4_activation_dtype() == ("bfloat16" if has_bf16 else "float32")
    has_avx2 = {"avx2", "fma", "f16c"} <= flags
    one_row = "vnni" if has_bf16 and "avx512_vnni" in flags else "avx2" if has_avx2 else "float"
    assert torch.ops.llmserve.int4_one_row_path() == one_row
    # the panel GEMM (bf16_panel_gemm.h) for batches of 10 rows and more, on the same instructions
    assert (torch.ops.llmserve.bf16_panel_min_rows() > 0) == has_bf16
    with pytest.raises(RuntimeError, match="at least 1"):
        torch.ops.llmserve.set_bf16_panel_min_rows(0)


def test_pack_int4_layout_is_the_documented_one():
    codes = torch.arange(64, dtype=torch.uint8).remainder(16).reshape(1, 64).flip(1).contiguous()
    packed = pack_int4(codes)
    q = codes[0].tolist()
    for g in range(2):
        for j in range(8):  # byte 2 j = q[j] | q[j + 8] << 4, byte 2 j + 1 = q[j + 16] | q[j + 24] << 4
            base = 32 * g
            assert int(packed[0, 16 * g + 2 * j]) == q[base + j] | q[base + j + 8] << 4
            assert int(packed[0, 16 * g + 2 * j + 1]) == q[base + j + 16] | q[base + j + 24] << 4


def test_native_int4_kernel_refuses_bad_shapes():
    ops = native_int4()
    groups = random_groups(torch.Generator().manual_seed(0), 8, 64)
    packed = pack_int4(groups.codes)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.int4_linear(
            torch.zeros(1, 48),
            packed[:, :24].contiguous(),
            groups.scales.half(),
            groups.mins.half(),
            torch.empty(1, 8),
        )
    with pytest.raises(RuntimeError, match="float16 scales and mins"):
        ops.int4_linear(torch.zeros(1, 64), packed, groups.scales, groups.mins, torch.empty(1, 8))
    with pytest.raises(RuntimeError, match="shapes differ"):
        ops.int4_linear(
            torch.zeros(1, 64), packed, groups.scales[:, :1].half(), groups.mins.half(), torch.empty(1, 8)
        )


def q4_bytes(weight: np.ndarray, kind: str) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(weight, getattr(GGMLQuantizationType, kind))


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_0"])
def test_gguf_blocks_run_exactly_in_the_native_layer(kind):
    """A GGUF file's blocks reach the kernel without a rounding: its scales and mins are the file's d and
    m (Q4_0: -8 d) bit for bit, and the layer computes x times the gguf package's own de-quantization."""
    native_int4()
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    weight = np.random.default_rng(3).normal(size=(48, 96)).astype(np.float32)
    raw = q4_bytes(weight, kind)
    groups = decode_q4_blocks(raw, kind)
    layer = Int4Linear(torch.from_numpy(weight), groups=groups)
    assert layer.backend == "native-int4" and layer.compute_dtype == torch.float32
    header = 4 if kind == "Q4_1" else 2
    blocks = raw.reshape(48, -1, header + 16)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else -8 * d
    assert layer.scales.dtype == torch.float16 and layer.mins.dtype == torch.float16
    assert np.array_equal(layer.scales.float().numpy(), d) and np.array_equal(layer.mins.float().numpy(), m)
    assert torch.equal(layer.weight, pack_int4(groups.codes))
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1))
    dequantized = torch.from_numpy(dequantize(raw, getattr(GGMLQuantizationType, kind))).double()
    expected = x.to(activation_dtype()).double() @ dequantized.T
    magnitude = x.double().abs() @ dequantized.abs().T
    assert float(((layer(x).double() - expected).abs() / magnitude).max()) < 2e-6


def test_int4_layer_falls_back_to_torchs_kernel_without_the_native_one(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    groups = random_groups(gen, 64, 128)
    monkeypatch.setattr(quant, "native_op", lambda name: None)
    layer = Int4Linear(groups.dequantize(), groups=groups)
    assert layer.backend == "int4pack" and layer.compute_dtype == torch.bfloat16
    x = torch.randn(3, 128, generator=gen)
    expected, _ = reference(x, groups)
    got = layer(x)
    assert got.dtype == torch.float32
    assert float((got.double() - expected).norm() / expected.norm()) < 1e-2  # bfloat16 inside
