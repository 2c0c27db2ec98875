"""Linear layers whose weights are packed once, at load time, for the CPU's matmul library. Shared by the
worker's model and the cache service's embedder, hence here; the worker's quantized layers are in
worker/model/quant.py.

`F.linear` on a CPU tensor goes to MKL with the weight in its plain [out, in] layout; oneDNN, given the
weight once and allowed to re-lay it out into its own blocked format (`_reorder_linear_weight`), runs the
same products faster in float32 and bfloat16 (docs/BENCHMARKS.md, engine notes). The packed weight is
opaque, so the plain copy stays available to callers that need it (the tied embedding table).

oneDNN compiles a kernel for every row count it meets (2-3 ms a shape at a few hundred rows on an AMX Xeon,
every layer shape apart), and a serving batch changes its row count from one step to the next; so the onednn
backend pads the rows up to a bucket (`padded_rows`: exact up to 32, then multiples of 16, of 64 past 512)
and `warm_up_linears` compiles every bucket of every layer shape once, at start. The LM head is warmed only
for the rows it meets in serving (one a sequence): warming its 49,152 x 576 product at every bucket up to 512
rows took 9 of a float32 start's 10 s on one thread (AVX2 EPYC), to save 2-3 ms per bucket.

On a CPU with AMX, bfloat16 layers run on the project's own tile kernel instead (worker/kernels/
amx_linear.cpp, weights laid out once for it): oneDNN read the weights of a decode step at 12-17 GB/s there,
the tile kernel at about what memory streams (22-24 GB/s past the L3 on a 2-core AMX Xeon); per step of
SmolLM2's linears, interleaved: 1 row 17.0 -> 11.5 ms, 8 rows 16.9 -> 11.6, 64 rows 23.9 -> 17.9, and a
512-row prefill chunk 106 -> 86 ms, so it replaces oneDNN at every row count and no second copy is kept.

Backends: "amx" (packed for the tile kernel: bfloat16 on an AMX CPU), "onednn" (packed, CPU only), "torch"
(plain `F.linear`, any device), "auto" (amx, else onednn, where available for the weight's device, dtype
and shape, else torch).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from common.hugepages import WEIGHTS
from common.native_kernels import native_op

LINEAR_BACKENDS = ("auto", "amx", "onednn", "torch")  # amx, onednn: weights prepacked (CPU); torch: F.linear
EXACT_ROWS = 32  # row counts up to this run as they are (decode batches); above, padded to a bucket


def padded_rows(rows: int) -> int:
    """The row count a onednn product of `rows` rows runs at: few shapes, little padding."""
    if rows <= EXACT_ROWS:
        return rows
    step = 16 if rows <= 512 else 64
    return -(-rows // step) * step


def row_buckets(max_rows: int) -> list[int]:
    """Every row count `padded_rows` gives for 1..max_rows."""
    return sorted({padded_rows(r) for r in range(1, max_rows + 1)})


# One packed layer per distinct product shape (out, in, dtype, bias or not): oneDNN's kernels are per shape,
# so warming one layer of a shape warms them all.
_SHAPES: weakref.WeakValueDictionary[tuple, Linear] = weakref.WeakValueDictionary()


def warm_up_linears(max_rows: int, fewer_rows: dict[Linear, int] | None = None) -> int:
    """Run every onednn layer shape made so far at every row bucket up to `max_rows` (up to
    `fewer_rows[layer]` for a layer named there, and so for its shape), so that no serving step waits for
    oneDNN to compile a kernel; returns the number of products run."""
    limits = {layer.shape_key: rows for layer, rows in (fewer_rows or {}).items()}
    runs = 0
    with torch.inference_mode():
        for key, layer in list(_SHAPES.items()):
            for rows in row_buckets(min(max_rows, limits.get(key, max_rows))):
                layer(torch.zeros(rows, layer.in_features, dtype=layer.dtype))
                runs += 1
    return runs


def onednn_available(weight: torch.Tensor) -> bool:
    ops = torch.ops.mkldnn
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and (weight.dtype != torch.bfloat16 or _bf16_supported())
    )


def amx_available(weight: torch.Tensor) -> bool:
    """Whether the AMX tile kernel can run this weight: bfloat16 on an AMX CPU, sides multiples of 32."""
    ops = native_op("amx_linear")
    return (
        ops is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[0] % 32 == 0
        and weight.shape[1] % 32 == 0
        and bool(ops.amx_linear_supported())
    )


def _bf16_supported() -> bool:
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(probe()) if probe is not None else False


class Linear:
    """y = x @ W.T (+ b) for 2-D x, with W held in the layout its backend runs fastest."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, backend: str = "auto") -> None:
        if backend not in LINEAR_BACKENDS:
            raise ValueError(f"unknown linear backend {backend!r}; expected one of {LINEAR_BACKENDS}")
        if backend == "auto":
            backend = "amx" if amx_available(weight) else "onednn" if onednn_available(weight) else "torch"
        elif backend == "amx" and not amx_available(weight):
            raise ValueError(
                f"the amx linear backend needs a bfloat16 CPU weight, both sides multiples of 32, on a CPU "
                f"with AMX tiles; got {weight.dtype} {tuple(weight.shape)} on {weight.device}"
            )
        elif backend == "onednn" and not onednn_available(weight):
            raise ValueError(
                f"the onednn linear backend needs a CPU float32/bfloat16 weight, got {weight.dtype} "
                f"on {weight.device}"
            )
        self.backend = backend
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.dtype = weight.dtype
        if backend == "amx":
            n, k = weight.shape
            self.weight = WEIGHTS.empty((n // 16, k // 2, 32), torch.bfloat16)  # on huge pages
            native_op("amx_linear").amx_pack_weight(weight.detach().contiguous(), self.weight)
        elif backend == "onednn":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
            _SHAPES.setdefault(self.shape_key, self)
        else:
            self.weight = weight.detach()

    @property
    def shape_key(self) -> tuple:
        """What oneDNN compiles a kernel per (with the row count): one warm-up serves every layer of it."""
        return (self.out_features, self.in_features, self.dtype, self.bias is not None)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(x @ gate.T) * (x @ up.T) for a layer whose weight is [gate; up], in one pass where the backend
        has one (amx without a bias: the same bits as the product followed by the native silu_and_mul, without
        writing and reading the product's 2 I columns); None elsewhere, and the caller runs the two."""
        if self.backend != "amx" or self.bias is not None:
            return None
        out = x.new_empty(x.shape[0], self.out_features // 2, dtype=torch.bfloat16)
        if x.shape[0]:
            torch.ops.llmserve.amx_linear_silu_mul(x.to(torch.bfloat16).contiguous(), self.weight, out)
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "amx":
            out = x.new_empty(x.shape[0], self.out_features, dtype=torch.bfloat16)
            if x.shape[0]:
                torch.ops.llmserve.amx_linear(x.to(torch.bfloat16).contiguous(), self.weight, out)
            return out.add_(self.bias) if self.bias is not None else out
        if self.backend != "onednn":
            return F.linear(x, self.weight, self.bias)
        rows = x.shape[0]
        padded = padded_rows(rows)
        if padded == rows:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias, "none", [], "")
        x = F.pad(x, (0, 0, 0, padded - rows))
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")[:rows]


class Bf16WeightLinear:
    """y = x @ W.T (+ b) with W stored in bfloat16 and float32 arithmetic (worker/kernels/
    bf16_weight_linear.cpp): half the bytes of float32 weights, and the only change from them is the weights'
    own rounding. For CPUs without native bfloat16, where oneDNN's bf16 path is emulated and slow."""

    backend = "bf16-weights"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        ops = bf16_weight_ops()
        if ops is None or weight.device.type != "cpu":
            raise ValueError("bfloat16-weight layers need the compiled CPU kernels (make kernels)")
        self._ops = ops
        self.out_features, self.in_features = weight.shape
        self.weight = WEIGHTS.copy(weight.detach().to(torch.bfloat16).contiguous())
        self.bias = bias.detach().float() if bias is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.float().contiguous()
        out = rows.new_empty(rows.shape[0], self.out_features)
        self._ops.bf16_weight_linear(rows, self.weight, out)
        return out.add_(self.bias) if self.bias is not None else out


def bf16_weight_ops() -> object | None:
    """`torch.ops.llmserve` where the compiled kernels include the bfloat16-weight linear, else None."""
    return native_op("bf16_weight_linear")


class PackedLinearModule(torch.nn.Module):
    """An nn.Linear replacement over any layer with the `Linear` call interface (2-D rows in and out), for
    models run by torch modules: any leading dimensions."""

    def __init__(self, layer: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.linear = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.linear(x.reshape(-1, x.shape[-1]))
        return rows.reshape(*x.shape[:-1], rows.shape[-1])


def replace_linear_layers(
    module: torch.nn.Module, make: Callable[[torch.nn.Linear], Callable[[torch.Tensor], torch.Tensor] | None]
) -> int:
    """Replace every nn.Linear inside `module` (in place, for inference) by what `make` builds from it (None:
    keep that one); returns how many were replaced."""
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            layer = make(child)
            if layer is not None:
                setattr(module, name, PackedLinearModule(layer))
                replaced += 1
        else:
            replaced += replace_linear_layers(child, make)
    return replaced


def pack_linear_layers(module: torch.nn.Module, backend: str = "auto") -> int:
    """Every nn.Linear inside `module` on weights packed for `backend` where it runs (see `Linear`)."""

    def make(child: torch.nn.Linear) -> Linear | None:
        bias = child.bias.detach() if child.bias is not None else None
        layer = Linear(child.weight.detach(), bias, backend)
        return layer if layer.backend != "torch" else None

    return replace_linear_layers(module, make)


def bf16_weight_layers(module: torch.nn.Module) -> int:
    """Every nn.Linear inside `module` on bfloat16-stored weights, float32 arithmetic (Bf16WeightLinear)."""
    return replace_linear_layers(module, lambda child: Bf16WeightLinear(child.weight, child.bias))
