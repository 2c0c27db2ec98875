"""int8 weights x int8 activations (`WORKER_QUANTIZATION=w8a8`): the products run in 8-bit integers.

The weight-only layers (quant.py) still multiply in floating point, so under load, where a step is many rows
and compute-bound, they are no faster than bfloat16. Here each step's activation rows are quantized on
the fly, one symmetric scale per row (per token, as vLLM's W8A8 and llama.cpp's q8 activations do), and
oneDNN runs the int8 GEMM on the CPU's integer dot-product instructions (VNNI: 64 int8 products per 512-bit
instruction, twice bfloat16's 32; AMX-INT8 tiles where present) over a weight re-laid out once at load time.

    y[m, n] = s_x[m] * s_w[n] * sum_k q_x[m, k] q_w[n, k]   (+ b[n])

with q_w = round(w / s_w) per output channel and q_x = round(x / s_x) per row, both in [-127, 127]. oneDNN's
integer kernels take the activations unsigned, so the codes travel as q_x + 128 with a zero point of 128
(exact: the same integers). The sums are exact int32; only the two roundings to 8 bits differ from float.
Perplexity against the unquantized model is what decides where it serves (bench/quant_study.py).

Where the project's kernels are built for a CPU with AVX512-VNNI or AMX-INT8, the layer runs its own integer
GEMM instead (worker/kernels/w8a8_linear.cpp: the same codes and integer sums, quantizing the rows and
rescaling the sums in the same call): oneDNN's call had ~30 us of fixed cost per layer and two extra passes
over the rows (docs/BENCHMARKS.md, "w8a8 linears of a decode step": 32 rows 15.7 against 7.0 ms on an AMX
Xeon, 11.0 on the VNNI path).

A few rows are another matter for oneDNN: there a product is bound by reading the weight, not by
arithmetic, and its call (plus quantizing the rows) costs more than the project's weight-only int8 kernel
(int8_linear.cpp) reading the same int8 codes with float32 rows. So on oneDNN, below `WEIGHT_ONLY_BELOW`
rows the layer runs that kernel on its codes (float32 activations, so no activation rounding at all). The
project's GEMM streams the codes faster than that kernel at every row count (120 distinct SmolLM2 layers,
AMX Xeon: 1 row 3.2 against 6.5 ms, 2 rows 3.8 against 15.4), so it runs every row count itself.
"""

from __future__ import annotations

import torch

from worker.kernels import native_op

ZERO_POINT = 128  # q_x + 128 in uint8: oneDNN's u8 x s8 integer GEMM, symmetric codes unchanged
WEIGHT_ONLY_BELOW = 6  # rows; fewer run the weight-only int8 kernel on the same codes (docs/STUDY_LOG.md)


def w8a8_available(device: torch.device) -> bool:
    """oneDNN's prepacked int8 linear exists here (a CPU torch build with mkldnn)."""
    ops = getattr(torch.ops, "onednn", None)
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(ops, "qlinear_prepack")
        and hasattr(ops, "qlinear_pointwise")
    )


def native_gemm(weight: torch.Tensor) -> object | None:
    """The project's integer GEMM (`torch.ops.llmserve`) where it runs this weight: built, a CPU with
    AVX512-VNNI or AMX-INT8, a CPU weight whose input side is a multiple of 64 and output side of 32."""
    ops = native_op("w8a8_linear")
    out_features, in_features = weight.shape
    if ops is None or weight.device.type != "cpu" or in_features % 64 or out_features % 32:
        return None
    return ops if ops.w8a8_linear_path() != "none" else None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes + 128 as uint8 [M, K], float32 scales [M, 1]), one symmetric scale per row."""
    rows = x.float()
    scales = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)
    codes = torch.round(rows / scales).add_(ZERO_POINT).to(torch.uint8)
    return codes, scales


class W8A8Linear:
    """y = x @ W.T (+ b) with int8 weights (one scale per output channel) and int8 activations (one scale per
    row, computed at each call). Same call interface as `common.linear.Linear`."""

    quantization = "w8a8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> None:
        """`native=False` keeps oneDNN's integer GEMM where the project's would run (for comparisons)."""
        self.gemm = native_gemm(weight) if native else None
        if self.gemm is None and not w8a8_available(weight.device):
            raise ValueError(
                f"w8a8 runs on the CPU's int8 dot products (the project's kernels or oneDNN's); neither is "
                f"available for a weight on {weight.device} (use WORKER_QUANTIZATION=int8 or none there)"
            )
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.weight_scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).contiguous()
        codes = torch.round(w / self.weight_scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.bias = bias.detach().float().contiguous() if bias is not None else None
        self.compute_dtype = torch.float32
        if self.gemm is not None:  # only the codes laid out for the kernel, and 128 * sum_k codes per channel
            self.backend = "native-w8a8"
            self.codes = None
            self.weight = torch.empty(self.out_features // 16, self.in_features // 4, 64, dtype=torch.int8)
            self.compensation = torch.empty(self.out_features, dtype=torch.int32)
            self.gemm.w8a8_pack_weight(codes, self.weight, self.compensation)
            self.weight_only, self.weight_only_below = None, None
        else:
            self.backend = "onednn-w8a8"
            self.codes = codes
            self.weight = torch.ops.onednn.qlinear_prepack(codes, None)
            self.zero_points = torch.zeros(self.out_features, dtype=torch.long)
            self.native = native_op("quantize_rows_u8")  # None before `make kernels`: the same steps in torch
            self.weight_only = native_op("int8_linear")  # the few-rows kernel; None before `make kernels`
            self.weight_only_below = WEIGHT_ONLY_BELOW if self.weight_only is not None else None
        for rows in {1, self.weight_only_below or 1}:  # both methods: fail at load, not on a request
            self(torch.zeros(rows, self.in_features))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_only_below is not None and x.shape[0] < self.weight_only_below:
            rows = x.float().contiguous()
            y = rows.new_empty(rows.shape[0], self.out_features)
            self.weight_only.int8_linear(rows, self.codes, self.weight_scales, y)
            y = y.to(x.dtype)
            return y.add_(self.bias.to(y.dtype)) if self.bias is not None else y
        if self.gemm is not None:
            rows = x.contiguous() if x.dtype in (torch.float32, torch.bfloat16) else x.float().contiguous()
            out = rows.new_empty(rows.shape[0], self.out_features)
            if rows.shape[0]:  # the kernel takes at least one row
                self.gemm.w8a8_linear(rows, self.weight, self.weight_scales, self.compensation, out)
            out = out.to(x.dtype)
            return out.add_(self.bias.to(out.dtype)) if self.bias is not None else out
        native = self.native if x.dtype in (torch.float32, torch.bfloat16) else None
        if native is not None:  # the same codes and scales in one pass per row (worker/kernels/fused_ops.cpp)
            x = x.contiguous()
            codes, scales = torch.empty(x.shape, dtype=torch.uint8), torch.empty(x.shape[0])
            native.quantize_rows_u8(x, codes, scales)
        else:
            codes, scales = quantize_rows(x)
        # oneDNN's integer GEMM (no project kernel for this CPU or shape). The weight scales are applied by
        # oneDNN with the sums; the row scales after (oneDNN takes one activation scale per call). Bias after
        # the row scale, so it is added unscaled.
        y = torch.ops.onednn.qlinear_pointwise(
            codes, 1.0, ZERO_POINT, self.weight, self.weight_scales, self.zero_points,
            None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        if native is not None:
            out = torch.empty(y.shape, dtype=x.dtype)
            native.scale_rows(y, scales, out)
        else:
            out = y.mul_(scales).to(x.dtype)
        return out.add_(self.bias.to(out.dtype)) if self.bias is not None else out

    def weight_codes(self) -> torch.Tensor:
        """The int8 weight codes [out, in] (for the native GEMM, read back from its layout)."""
        if self.codes is not None:
            return self.codes
        blocks, quads, _ = self.weight.shape  # [N / 16, K / 4, 16 channels x 4 columns]
        return self.weight.reshape(blocks, quads, 16, 4).permute(0, 2, 1, 3).reshape(blocks * 16, quads * 4)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """What `__call__` computes, in float64 (up to float32 rounding): the rows as they are against the
        8-bit weights below `weight_only_below` rows, the same integers as the integer GEMM's from it."""
        weights = self.weight_codes().double()
        if self.weight_only_below is not None and x.shape[0] < self.weight_only_below:
            y = x.double() @ (weights * self.weight_scales.double()[:, None]).T
            return y + self.bias.double() if self.bias is not None else y
        codes, scales = quantize_rows(x)
        sums = (codes.double() - ZERO_POINT) @ weights.T
        y = sums * scales.double() * self.weight_scales.double()
        return y + self.bias.double() if self.bias is not None else y
