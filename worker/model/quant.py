"""Weight-only quantized linear layers (activations stay floating point).

- int8: one symmetric scale per output channel.
- int4: asymmetric groups of 32 input features (`Int4Groups`), w = d q + m with 4-bit codes q: llama.cpp's
  Q4_1 block exactly, and Q4_0 with m = -8 d, so a GGUF file's 4-bit blocks load without a round trip
  through float.

On CPU the project's kernels (worker/kernels/int8_linear.cpp, int4_linear.cpp) run them; elsewhere, or
before `make kernels`, torch's int8/int4 pack-mm ops, fed bfloat16 (the only inputs they vectorize on CPU).
On a CPU with native bfloat16 the method changes with the batch: weights formed in registers for a few
rows, a bfloat16 panel GEMM (worker/kernels/bf16_panel_gemm.h) for more, and from `DEQUANTIZE_MIN_ROWS`
the weight dequantized once for oneDNN's GEMM. Why, with the figures: docs/STUDY_LOG.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from common.hugepages import WEIGHTS
from common.linear import Linear
from worker.engine.config import QUANTIZATIONS
from worker.kernels import native_op
from worker.model.cpu_kind import cpu_info
from worker.model.w8a8 import W8A8Linear

if TYPE_CHECKING:  # imported where it is built: w4a8.py builds on this module's Int4Groups
    from worker.model.w4a8 import W4A8Linear

INT4_GROUP_SIZE = 32  # llama.cpp's block; the engine's widths (576, 1536) are multiples of 32 but not of 128
# From this many rows a native layer on a CPU with native bfloat16 dequantizes its weights and runs one oneDNN
# bfloat16 GEMM instead of its own kernel, as vLLM's AWQ layers do for large batches (docs/STUDY_LOG.md).
DEQUANTIZE_MIN_ROWS = 256
# On AMX oneDNN's bfloat16 GEMM runs on tiles and wins earlier: a one-request int4 prefill step in process,
# panel GEMM against dequantized, 96 tokens 160 against 72 ms, 128 tokens 206 against 82 (AMX Xeon, 2 cores).
# Served (bench.quant_study, int4, 128-token prompts; runs of 256 / 96 taking turns): TTFT p50 at one stream
# 51.7-63.0 against 52.7-55.0 ms, tok/s at 8 streams 170-182 against 184-185, at 32 streams 310-343 against
# 327-338. Kept above the decode batches (at most 64 sequences): from 24-32 rows a decode step that
# dequantized every weight served slower.
DEQUANTIZE_MIN_ROWS_AMX = 96


def native_cpu_bfloat16() -> bool:
    """oneDNN computes bfloat16 natively on this CPU (AVX512-BF16 or AMX), as vLLM's CPU backend checks."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return probe is not None and bool(probe())


def dequantize_min_rows(device: torch.device) -> int | None:
    """The row count from which a native quantized layer dequantizes for a bfloat16 GEMM, or None where it
    never does (without native bfloat16 the native kernels beat float32 oneDNN at every batch size)."""
    if device.type != "cpu" or not native_cpu_bfloat16():
        return None
    return DEQUANTIZE_MIN_ROWS_AMX if cpu_info().kind == "amx" else DEQUANTIZE_MIN_ROWS


def compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels run in: bfloat16 on CPU (see the module docstring), else the model's."""
    return torch.bfloat16 if device.type == "cpu" else dtype


@dataclass
class Int4Groups:
    """4-bit codes with one scale and min per group of `group_size` input features, for [N, K] weights.

    codes: uint8 [N, K] in 0..15; scales, mins: float32 [N, K // group_size]; w = q * s + m (Q4_1's form).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    group_size: int = INT4_GROUP_SIZE

    @classmethod
    def from_float(cls, weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Groups:
        """Min/max asymmetric rounding per group (what llama.cpp's Q4_1 does), with the scale and min rounded
        to float16 first (the native kernel stores them so) and the codes rounded against those."""
        n, k = weight.shape
        if k % group_size:
            raise ValueError(f"int4 needs in_features divisible by {group_size}, got {k}")
        groups = weight.detach().float().reshape(n, k // group_size, group_size)
        low, high = groups.amin(-1).half().float(), groups.amax(-1)
        scales = ((high - low) / 15).half().float()
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round((groups - low.unsqueeze(-1)) / safe.unsqueeze(-1)).clamp(0, 15)
        return cls(codes.to(torch.uint8).reshape(n, k), scales, low, group_size)

    @staticmethod
    def cat(parts: list[Int4Groups]) -> Int4Groups:
        """Stack along output features (fused q/k/v and gate/up projections)."""
        if len({p.group_size for p in parts}) != 1:
            raise ValueError("int4 groups of different sizes cannot be fused")
        return Int4Groups(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.mins for p in parts]),
            parts[0].group_size,
        )

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        q = self.codes.float().reshape(n, k // self.group_size, self.group_size)
        return (q * self.scales.unsqueeze(-1) + self.mins.unsqueeze(-1)).reshape(n, k)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> [N, K / 2] bytes in the native kernel's layout (int4_linear.cpp).

    Per group of 32, eight little-endian 16-bit words: word j holds weights j, j + 8, j + 16, j + 24 in its
    nibbles from the lowest up, i.e. byte 2 j = q[j] | q[j + 8] << 4 and byte 2 j + 1 = q[j + 16] |
    q[j + 24] << 4.
    """
    n, k = codes.shape
    if k % INT4_GROUP_SIZE:
        raise ValueError(f"int4 needs in_features divisible by {INT4_GROUP_SIZE}, got {k}")
    q = codes.to(torch.uint8).reshape(n, k // INT4_GROUP_SIZE, 4, 8)  # [N, group, t, j]: weight 8 t + j
    low, high = q[:, :, 0] | (q[:, :, 1] << 4), q[:, :, 2] | (q[:, :, 3] << 4)  # [N, group, j]
    return torch.stack([low, high], dim=-1).reshape(n, k // 2).contiguous()


class Int8Linear:
    """y = x @ (q * s).T (+ b): int8 weights, one scale per output channel.

    On CPU with the compiled kernels (worker/kernels/int8_linear.cpp) the products run in float32 straight
    from the int8 rows; elsewhere through torch's `_weight_int8pack_mm` (bfloat16 rows on CPU)."""

    quantization = "int8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.native = _native_int8(w.device)
        self.backend = "native-int8" if self.native is not None else "int8pack"
        self.compute_dtype = (
            torch.float32 if self.native is not None else compute_dtype(w.device, weight.dtype)
        )
        # Codes are rounded against the scale as the kernel will see it (bfloat16 for int8pack on CPU), so the
        # scale's own rounding (up to half a step at the largest codes) does not add to the codes' rounding.
        self.scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).to(self.compute_dtype)
        codes = torch.round(w / self.scales.float()[:, None]).clamp(-127, 127)
        self.weight = codes.to(torch.int8).contiguous()
        if self.native is not None:
            self.weight = WEIGHTS.copy(self.weight)  # on huge pages
        self.bias = bias.detach() if bias is not None else None
        self.dequantize_from = dequantize_min_rows(w.device) if self.native is not None else None
        _probe(self)

    def bfloat16_weight(self) -> torch.Tensor:
        weight = torch.empty(self.out_features, self.in_features, dtype=torch.bfloat16)
        self.native.int8_dequantize(self.weight, self.scales, weight)
        return weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (y := _dequantized_call(self, x)) is not None:
            return y
        rows = x.to(self.compute_dtype).contiguous()
        if self.native is not None:
            y = rows.new_empty(rows.shape[0], self.out_features)
            self.native.int8_linear(rows, self.weight, self.scales, y)
            y = y.to(x.dtype)
        else:
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scales).to(x.dtype)
        return y + self.bias if self.bias is not None else y


def _native_int8(device: torch.device) -> object | None:
    """The compiled int8 kernel where it runs (CPU, `make kernels` done), else None."""
    return native_op("int8_linear") if device.type == "cpu" else None


class Int4Linear:
    """y = x @ W.T (+ b) with W held as `Int4Groups`.

    On CPU with the compiled kernels (worker/kernels/int4_linear.cpp) the groups are kept as they are (codes
    two per byte, float16 scales and mins, so a GGUF file's blocks stay exact: 0.625 bytes per weight) and
    the products run in float32; otherwise through torch's `_weight_int4pack_mm_for_cpu` (bfloat16 rows and
    groups)."""

    quantization = "int4"

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, groups: Int4Groups | None = None
    ) -> None:
        if weight.device.type != "cpu":
            raise ValueError(
                f"int4 weights run on CPU kernels only; got a weight on {weight.device} "
                "(use WORKER_QUANTIZATION=int8 or none there)"
            )
        groups = groups or Int4Groups.from_float(weight)
        self.out_features, self.in_features = groups.codes.shape
        self.group_size = groups.group_size
        self.native = native_op("int4_linear") if self.group_size == INT4_GROUP_SIZE else None
        self.bias = bias.detach() if bias is not None else None
        if self.native is not None:
            self.backend = "native-int4"
            self.compute_dtype = torch.float32
            self.weight = WEIGHTS.copy(pack_int4(groups.codes))  # on huge pages
            # float16, as a GGUF file has them: exact for its blocks and for `from_float`'s (rounded so).
            self.scales = groups.scales.half().contiguous()
            self.mins = groups.mins.half().contiguous()
            self.dequantize_from = dequantize_min_rows(weight.device)
        else:
            self.backend = "int4pack"
            self.compute_dtype = compute_dtype(weight.device, weight.dtype)
            self.weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes.to(torch.int32), 1)
            # [K / group, N, 2]: the kernel's layout of (scale, offset) pairs, w = (q - 8) s + z
            offsets = groups.mins + 8 * groups.scales
            pairs = torch.stack([groups.scales, offsets], dim=-1).transpose(0, 1)
            self.scales_and_offsets = pairs.to(self.compute_dtype).contiguous()
            self.dequantize_from = None
        _probe(self)

    def bfloat16_weight(self) -> torch.Tensor:
        weight = torch.empty(self.out_features, self.in_features, dtype=torch.bfloat16)
        self.native.int4_dequantize(self.weight, self.scales, self.mins, weight)
        return weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (y := _dequantized_call(self, x)) is not None:
            return y
        rows = x.to(self.compute_dtype).contiguous()
        if self.native is not None:
            y = rows.new_empty(rows.shape[0], self.out_features)
            self.native.int4_linear(rows, self.weight, self.scales, self.mins, y)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows, self.weight, self.group_size, self.scales_and_offsets
            )
        y = y.to(x.dtype)
        return y + self.bias if self.bias is not None else y


def _dequantized_call(layer: Int8Linear | Int4Linear, x: torch.Tensor) -> torch.Tensor | None:
    """From `dequantize_from` rows: x @ W.T (+ b) on oneDNN's bfloat16 GEMM over the layer's weights
    dequantized to bfloat16 (products and sums as oneDNN does them, output rounded to bfloat16), in x's
    dtype; None below it (or where the layer never dequantizes)."""
    if layer.dequantize_from is None or x.shape[0] < layer.dequantize_from:
        return None
    y = F.linear(x.to(torch.bfloat16), layer.bfloat16_weight()).to(x.dtype)
    return y + layer.bias if layer.bias is not None else y


def _probe(layer: Int8Linear | Int4Linear) -> None:
    """Run one row at load time, so a device without the kernel fails at start, not on a request."""
    device = layer.weight.device
    try:
        layer(torch.zeros(1, layer.in_features, dtype=layer.compute_dtype, device=device))
    except (NotImplementedError, RuntimeError) as exc:
        message = f"{layer.quantization} weights: torch has no usable kernel on {device}: {exc}"
        raise ValueError(message) from exc


def quantized_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    quantization: str,
    int4_groups: Int4Groups | None = None,
) -> Int8Linear | Int4Linear | W8A8Linear | W4A8Linear:
    """The quantized layer for `quantization` ("int8", "int4", "w8a8" or "w4a8"), with the `Linear` call
    interface."""
    if quantization == "int8":
        return Int8Linear(weight, bias)
    if quantization == "int4":
        return Int4Linear(weight, bias, int4_groups)
    if quantization == "w8a8":
        return W8A8Linear(weight, bias)
    if quantization == "w4a8":
        from worker.model.w4a8 import W4A8Linear

        return W4A8Linear(weight, bias, int4_groups)
    raise ValueError(f"unknown quantization {quantization!r}; expected one of {QUANTIZATIONS}")


def build_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    backend: str,
    quantization: str = "none",
    int4_groups: Int4Groups | None = None,
) -> Linear | Int8Linear | Int4Linear | W8A8Linear | W4A8Linear:
    """The engine's one way to build a linear layer: float (`Linear`) or quantized."""
    if quantization == "none":
        return Linear(weight, bias, backend)
    return quantized_linear(weight, bias, quantization, int4_groups)
