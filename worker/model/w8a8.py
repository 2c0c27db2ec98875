"""int8 weights x int8 activations (`WORKER_QUANTIZATION=w8a8`): the products run in 8-bit integers.

The weight-only layers (quant.py) still multiply in floating point, so under load, where a step is many rows
and compute-bound, they are no faster than bfloat16. Here each step's activation rows are quantized on
the fly and the project's integer GEMM (worker/kernels/w8a8_linear.cpp) runs the products on the CPU's
integer dot-product instructions (VNNI: 64 int8 products per 512-bit instruction, twice bfloat16's 32),
quantizing the rows and rescaling the sums in the same call:

    y[n] = s_w[n] * sum_g s_x[g] * sum_{k in g} q_x[k] q_w[n, k]   (+ b[n])

with q_w = round(w / s_w) per output channel and q_x = round(x / s_x[g]) per group g of GROUP columns of the
row (32 on AVX2, below), both in [-127, 127]: one scale per group, as llama.cpp's q8 activations have one per
32, because one scale per row (vLLM's per-token W8A8) cost the bundled model 1.45% of perplexity and 64-column
groups a few tenths (docs/STUDY_LOG.md). The integer instructions take the activations unsigned, so the codes
travel as q_x + 128 (exact: the same integers, 128 times each group's code sum subtracted). The sums are exact
int32; only the two roundings to 8 bits differ from float. Perplexity against the unquantized model is what
decides where it serves (bench/quant_study.py).

On AVX2 without VNNI the kernel multiplies on VPMADDUBSW, whose 16-bit pair sums would overflow on 8-bit
codes on both sides; there the row codes are 7-bit (|q_x| <= 63, `row_max_code()`, signed against the weight
codes made unsigned inside the kernel) with one scale per 32 columns (`row_group()`), which with the smoothing
in front keeps them about half a percent of perplexity from 8-bit ones (docs/STUDY_LOG.md), for about twice
the int8 weight-only kernel's products per second from 16 rows up (bench/w8a8_kernels.py).

oneDNN's int8 GEMM, which this layer ran before the project's kernel, takes one activation scale per call and
cost ~30 us of fixed overhead per layer, so it is not a fallback: a CPU without AVX2 (or a build without the
kernels) has no w8a8, and the worker says so at start.
"""

from __future__ import annotations

import torch

from worker.kernels import native_op

ZERO_POINT = 128  # q_x + 128 in uint8: the u8 x s8 integer instructions, symmetric codes unchanged
GROUP = 64  # columns per weight-code group (the compensation's) and per row scale on VNNI (kGroup)


def w8a8_available(device: torch.device) -> bool:
    """The project's integer GEMM runs here: the kernels built, a CPU with AVX512-VNNI (AMX CPUs have it) or
    AVX2."""
    ops = native_op("w8a8_linear")
    return device.type == "cpu" and ops is not None and ops.w8a8_linear_supported()


def row_max_code() -> int:
    """The largest |code| of a quantized row on this build: 127, or 63 where the kernel runs on AVX2."""
    return int(native_op("w8a8_linear").w8a8_row_max_code())


def row_group() -> int:
    """Columns per row scale on this build: GROUP, or 32 where the kernel runs on AVX2."""
    return int(native_op("w8a8_linear").w8a8_row_group())


def quantize_rows(
    x: torch.Tensor, max_code: int = 127, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes + 128 as uint8 [M, K], float32 scales [M, K / group]), one symmetric scale per
    group of columns, codes in [-max_code, max_code] (what the kernel computes, in torch: the reference of
    tests)."""
    rows = x.float()
    groups = rows.reshape(rows.shape[0], -1, group)
    scales = groups.abs().amax(dim=2, keepdim=True).clamp_(min=1e-12).div_(max_code)
    codes = torch.round(groups / scales).add_(ZERO_POINT).to(torch.uint8)
    return codes.reshape(rows.shape), scales.squeeze(2)


class IntegerRowsLinear:
    """The call of a layer whose kernel quantizes the rows itself (w8a8 here, w4a8.py): float32 or bfloat16
    rows in, out in their dtype, the bias added after. Subclasses give `_product(rows, out)`."""

    out_features: int
    bias: torch.Tensor | None

    def _product(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.contiguous() if x.dtype in (torch.float32, torch.bfloat16) else x.float().contiguous()
        out = rows.new_empty(rows.shape[0], self.out_features)
        if rows.shape[0]:  # the kernels take at least one row
            self._product(rows, out)
        out = out.to(x.dtype)
        return out.add_(self.bias.to(out.dtype)) if self.bias is not None else out


class W8A8Linear(IntegerRowsLinear):
    """y = x @ W.T (+ b) with int8 weights (one scale per output channel) and int8 activations (one scale per
    group of `row_group()` columns of a row, computed at each call). Same call interface as
    `common.linear.Linear`."""

    quantization = "w8a8"
    backend = "native-w8a8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        out_features, in_features = weight.shape
        if not w8a8_available(weight.device):
            raise ValueError(
                f"w8a8 runs on the project's integer GEMM, which needs the compiled kernels (`make kernels`) "
                f"and a CPU with AVX512-VNNI or AVX2; a weight on {weight.device} here has neither "
                f"(use WORKER_QUANTIZATION=int8 or none)"
            )
        if not self.fits(weight):
            raise ValueError(
                f"w8a8 needs layers of whole groups: in_features a multiple of {GROUP} and out_features of "
                f"32, got {in_features} -> {out_features} (use WORKER_QUANTIZATION=int8 or none here)"
            )
        self.gemm = native_op("w8a8_linear")
        self.row_max_code, self.row_group = row_max_code(), row_group()
        w = weight.detach().float()
        self.out_features, self.in_features = out_features, in_features
        self.weight_scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).contiguous()
        codes = torch.round(w / self.weight_scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.bias = bias.detach().float().contiguous() if bias is not None else None
        self.compute_dtype = torch.float32
        # Only the codes laid out for the kernel, and 128 * (sum of each group's codes) per channel (VNNI's;
        # the AVX2 kernel takes its compensation from the rows).
        self.weight = torch.empty(out_features // 16, in_features // 4, 64, dtype=torch.int8)
        self.compensation = torch.empty(in_features // GROUP, out_features, dtype=torch.int32)
        self.gemm.w8a8_pack_weight(codes, self.weight, self.compensation)
        self(torch.zeros(1, in_features))  # fail at load, not on a request

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """The kernel's shapes: inputs in whole groups of GROUP columns, outputs in whole pairs of 16-channel
        blocks."""
        out_features, in_features = weight.shape
        return in_features % GROUP == 0 and out_features % 32 == 0

    def _product(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        self.gemm.w8a8_linear(rows, self.weight, self.weight_scales, self.compensation, out)

    def weight_codes(self) -> torch.Tensor:
        """The int8 weight codes [out, in], read back from the kernel's layout."""
        blocks, quads, _ = self.weight.shape  # [N / 16, K / 4, 16 channels x 4 columns]
        return self.weight.reshape(blocks, quads, 16, 4).permute(0, 2, 1, 3).reshape(blocks * 16, quads * 4)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """What `__call__` computes, in float64 (up to float32 rounding): the same integer sums per group."""
        codes, scales = quantize_rows(x, self.row_max_code, self.row_group)
        groups = (codes.double() - ZERO_POINT).reshape(x.shape[0], -1, self.row_group)
        weights = self.weight_codes().double().reshape(self.out_features, -1, self.row_group)
        sums = torch.einsum("mgk,ngk->mgn", groups, weights)  # each group's integer sums, exact
        y = (sums * scales.double()[:, :, None]).sum(dim=1) * self.weight_scales.double()
        return y + self.bias.double() if self.bias is not None else y


def quantized_head_rows(weight: torch.Tensor) -> bool:
    """Whether a w8a8 (or w4a8) model's LM head quantizes its rows too: where they are float32 and the GEMM is
    the AVX2 kernel, where it was measured. For SmolLM2's 49152 x 576 head (AVX2 EPYC, two threads) the w8a8
    GEMM took 1.5 / 1.7 / 1.8 / 2.1x less time than the int8 weight-only kernel at 5 / 8 / 32 / 64 rows (the
    head was a quarter of a 64-sequence decode step), 0.8-0.9x at 1-2 rows; its 7-bit rows cost the tune text
    0.16% of perplexity on top of the decoder layers' (docs/STUDY_LOG.md). Every row count takes the same
    path, so a row's logits do not depend on its batch (a prompt's logprobs equal the sampled token's).
    Elsewhere the head keeps float rows: int8 weights in float32 on AVX512-VNNI builds (not measured there),
    bfloat16 in bfloat16, and so does a vocabulary the GEMM's channel blocks do not divide (32001 entries,
    say)."""
    return (
        weight.dtype == torch.float32
        and w8a8_available(weight.device)
        and row_max_code() < 127
        and W8A8Linear.fits(weight)
    )
