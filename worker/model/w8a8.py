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
"""

from __future__ import annotations

import torch

from worker.kernels import native_op

ZERO_POINT = 128  # q_x + 128 in uint8: oneDNN's u8 x s8 integer GEMM, symmetric codes unchanged


def w8a8_available(device: torch.device) -> bool:
    """oneDNN's prepacked int8 linear exists here (a CPU torch build with mkldnn)."""
    ops = getattr(torch.ops, "onednn", None)
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(ops, "qlinear_prepack")
        and hasattr(ops, "qlinear_pointwise")
    )


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
    backend = "onednn-w8a8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if not w8a8_available(weight.device):
            raise ValueError(
                f"w8a8 runs on oneDNN's CPU int8 kernels; not available for a weight on {weight.device} "
                "(use WORKER_QUANTIZATION=int8 or none there)"
            )
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.weight_scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).contiguous()
        self.codes = torch.round(w / self.weight_scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.weight = torch.ops.onednn.qlinear_prepack(self.codes, None)
        self.zero_points = torch.zeros(self.out_features, dtype=torch.long)
        self.bias = bias.detach().float().contiguous() if bias is not None else None
        self.compute_dtype = torch.float32
        self.native = native_op("quantize_rows_u8")  # None before `make kernels`: the same steps in torch ops
        self(torch.zeros(1, self.in_features))  # fail at load, not on a request

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        native = self.native if x.dtype in (torch.float32, torch.bfloat16) else None
        if native is not None:  # the same codes and scales in one pass per row (worker/kernels/fused_ops.cpp)
            x = x.contiguous()
            codes, scales = torch.empty(x.shape, dtype=torch.uint8), torch.empty(x.shape[0])
            native.quantize_rows_u8(x, codes, scales)
        else:
            codes, scales = quantize_rows(x)
        # The weight scales are applied by oneDNN with the sums; the row scales after (oneDNN takes one
        # activation scale per call). Bias after the row scale, so it is added unscaled.
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

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same integers multiplied in float64: what `__call__` computes, up to float32 rounding."""
        codes, scales = quantize_rows(x)
        sums = (codes.double() - ZERO_POINT) @ self.codes.double().T
        y = sums * scales.double() * self.weight_scales.double()
        return y + self.bias.double() if self.bias is not None else y
