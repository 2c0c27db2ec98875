"""4-bit weights x int8 activations (`WORKER_QUANTIZATION=w4a8`): llama.cpp's Q4_1 x Q8_1 products.

The weights are the int4 layer's groups (worker/model/quant.py `Int4Groups`: a GGUF file's own Q4_1 blocks
where the model has one, else quantized from float at load), so they are the same weights int4 computes. Where
int4 multiplies them in float32, here each step's activation rows are quantized per group of the same 32
columns (8-bit codes, one scale each, as llama.cpp's Q8_1) and the products run on the CPU's integer
multiply-adds (worker/kernels/w4a8_linear.cpp: AVX2, or AVX512-VNNI where the CPU has it): a group's part of a
row's dot product is

    s_x (d sum_k q_x[k] q_w[k] + m sum_k q_x[k])

with the integer sums exact; only the rows' rounding to 8 bits differs from int4. Against w8a8 (w8a8.py) the
weights are half the bytes and stay as the file has them (w8a8 rounds them again to 8 bits, and its rows to
7 bits on AVX2, where 8-bit weights would overflow the instruction's 16-bit pair sums); there is no smoothing,
since moving the activations' outliers into the weights would mean quantizing the weights again.
"""

from __future__ import annotations

import torch

from worker.kernels import native_op
from worker.model.quant import Int4Groups
from worker.model.w8a8 import ZERO_POINT, IntegerRowsLinear, quantize_rows

GROUP = 32  # weights per (scale, min) and columns per row scale


def w4a8_available(device: torch.device) -> bool:
    """The kernel runs here: the kernels built, on a CPU with AVX2."""
    ops = native_op("w4a8_linear")
    return device.type == "cpu" and ops is not None and ops.w4a8_linear_supported()


class W4A8Linear(IntegerRowsLinear):
    """y = x @ W.T (+ b) with W as `Int4Groups` (4-bit codes, a float16 scale and min per 32 inputs) and x
    quantized per call to 8-bit codes with one scale per 32 columns. Same call interface as
    `common.linear.Linear`."""

    quantization = "w4a8"
    backend = "native-w4a8"

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, groups: Int4Groups | None = None
    ) -> None:
        out_features, in_features = weight.shape
        if not w4a8_available(weight.device):
            raise ValueError(
                f"w4a8 runs on the project's AVX2 kernel, which needs the compiled kernels (`make kernels`) "
                f"and a CPU with AVX2; a weight on {weight.device} here has neither "
                f"(use WORKER_QUANTIZATION=int4 or none)"
            )
        if not self.fits(weight):
            raise ValueError(
                f"w4a8 needs in_features a multiple of {GROUP} and out_features of 16, got "
                f"{in_features} -> {out_features} (use WORKER_QUANTIZATION=int4 or none here)"
            )
        groups = groups or Int4Groups.from_float(weight)
        if groups.group_size != GROUP:
            raise ValueError(f"w4a8 takes groups of {GROUP} weights, got {groups.group_size}")
        self.gemm = native_op("w4a8_linear")
        self.out_features, self.in_features = out_features, in_features
        self.bias = bias.detach().float().contiguous() if bias is not None else None
        self.compute_dtype = torch.float32
        self.weight = torch.empty(out_features // 16, in_features // 4, 32, dtype=torch.uint8)
        self.scales_mins = torch.empty(out_features // 16, in_features // GROUP, 32, dtype=torch.float16)
        self.gemm.w4a8_pack_weight(
            groups.codes.contiguous(),
            groups.scales.float().contiguous(),
            groups.mins.float().contiguous(),
            self.weight,
            self.scales_mins,
        )
        self(torch.zeros(1, in_features))  # fail at load, not on a request

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """The kernel's shapes: inputs in whole groups, outputs in whole blocks of 16 channels."""
        out_features, in_features = weight.shape
        return in_features % GROUP == 0 and out_features % 16 == 0

    def _product(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        self.gemm.w4a8_linear(rows, self.weight, self.scales_mins, out)

    def groups(self) -> Int4Groups:
        """The weights as `Int4Groups` (float16 scales and mins widened), read back from the kernel's
        layout."""
        blocks, steps, _ = self.weight.shape  # [N / 16, K / 4, 8 channels x 4 columns, two nibbles each]
        both = self.weight.reshape(blocks, steps, 8, 4)
        halves = torch.stack([both & 0x0F, both >> 4], dim=1)  # [N / 16, 2, K / 4, 8, 4]
        codes = halves.permute(0, 1, 3, 2, 4).reshape(self.out_features, self.in_features)
        dm = self.scales_mins.float()  # [N / 16, K / 32, 32]: d of 16 channels, then m
        scales = dm[:, :, :16].permute(0, 2, 1).reshape(self.out_features, -1)
        mins = dm[:, :, 16:].permute(0, 2, 1).reshape(self.out_features, -1)
        return Int4Groups(codes.contiguous(), scales, mins, GROUP)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """What `__call__` computes, in float64 (up to float32 rounding): the same integer sums per group."""
        codes, row_scales = quantize_rows(x, 127, GROUP)
        rows = (codes.double() - ZERO_POINT).reshape(x.shape[0], -1, GROUP)  # [M, G, 32]
        groups = self.groups()
        q = groups.codes.double().reshape(self.out_features, -1, GROUP)  # [N, G, 32]
        dots = torch.einsum("mgk,ngk->mng", rows, q)  # exact integer sums
        y = dots * groups.scales.double() + rows.sum(-1)[:, None, :] * groups.mins.double()
        y = (y * row_scales.double()[:, None, :]).sum(-1)
        return y + self.bias.double() if self.bias is not None else y
