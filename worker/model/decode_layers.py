"""Every decoder layer of a decode-only step in one native call (worker/kernels/decode_layers.cpp).

A decode step through `_forward_native`'s per-layer loop makes ~15 Python and small torch calls per layer
(views, casts, fresh outputs, the attention wrapper) between the kernels: at one stream a third of the 135M
model's int4 step, and at 64 sequences in bfloat16 still ~15% of the forward pass, the same few milliseconds
at every batch size. The op chains the same kernels in C++, so it gives the same numbers. It covers the
plain Llama layer (no bias) with every linear on one kernel: the project's int4 or int8 kernels (float32),
its AMX tile kernel (bfloat16), its w8a8 or w4a8 integer GEMMs, or oneDNN's prepacked GEMM; decode tokens
only.
Anything else keeps `_forward_native`'s per-layer loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.linear import padded_rows
from worker.model.attention import AttentionMetadata


@dataclass(frozen=True)
class _Kernel:
    """How the op runs one backend's linears."""

    name: str  # the op's `linear` argument
    tensors: tuple[str, ...]  # the layer's tensors it is given, in order
    dtypes: tuple[torch.dtype, ...]  # the activation dtypes the kernel takes
    leaves_at: str | None = None  # the layer's attribute holding the rows from which it leaves the kernel


# Linear backend (the layers' `backend`) -> the kernel the op runs for it.
_KERNELS = {
    "native-int4": _Kernel("int4", ("weight", "scales", "mins"), (torch.float32,), "dequantize_from"),
    "native-int8": _Kernel("int8", ("weight", "scales"), (torch.float32,), "dequantize_from"),
    "amx": _Kernel("amx", ("weight",), (torch.bfloat16,)),
    "native-w8a8": _Kernel(
        "w8a8", ("weight", "weight_scales", "compensation"), (torch.float32, torch.bfloat16)
    ),
    "native-w4a8": _Kernel("w4a8", ("weight", "scales_mins"), (torch.float32, torch.bfloat16)),
    "onednn": _Kernel("onednn", ("weight",), (torch.float32, torch.bfloat16)),
}


@dataclass
class DecodeLayers:
    """The op and the model's weights as the TensorLists it takes, gathered once per model."""

    ops: object  # torch.ops.llmserve
    linear: str  # the kernel of every linear (_KERNELS' names)
    input_norms: list[torch.Tensor]
    post_norms: list[torch.Tensor]
    qkv: list[torch.Tensor]  # each layer's tensors (_KERNELS), layer after layer
    o_proj: list[torch.Tensor]
    gate_up: list[torch.Tensor]
    down: list[torch.Tensor]
    num_heads: int
    num_kv_heads: int
    eps: float
    # From this many tokens the layers dequantize for a bfloat16 GEMM (worker/model/quant.py), which beats the
    # op's native products by more than the op saves; None: the op takes any decode step.
    max_tokens: int | None = None
    _pools: tuple[list, list[torch.Tensor], list[torch.Tensor]] | None = None

    @classmethod
    def build(cls, model: object, ops: object | None) -> DecodeLayers | None:
        """The op for `model` (a LlamaForPagedAttention on the native kernels), or None where it does not
        apply: a build without the op, a layer beyond plain Llama, linears on a backend the op does not
        chain (_KERNELS) or on two backends, activations of a dtype their kernel does not take, or a bias."""
        if ops is None or not hasattr(ops, "decode_layers"):
            return None
        if not model.supports_native_kernels or model.activation != "silu":
            return None
        roles = ("qkv", "o_proj", "gate_up", "down")
        linears = [getattr(layer, role) for layer in model.layers for role in roles]
        backends = {getattr(linear, "backend", None) for linear in linears}
        if len(backends) != 1 or not backends <= _KERNELS.keys():
            return None
        kernel = _KERNELS[backends.pop()]
        if model.embed.dtype not in kernel.dtypes or any(linear.bias is not None for linear in linears):
            return None
        if kernel.name == "onednn" and any(linear.dtype != model.embed.dtype for linear in linears):
            return None
        thresholds = [getattr(linear, kernel.leaves_at) for linear in linears] if kernel.leaves_at else []

        def tensors(role: str) -> list[torch.Tensor]:
            return [getattr(getattr(layer, role), name) for layer in model.layers for name in kernel.tensors]

        s = model.shape
        return cls(
            ops,
            kernel.name,
            [layer.input_norm.contiguous() for layer in model.layers],
            [layer.post_norm.contiguous() for layer in model.layers],
            *(tensors(role) for role in roles),
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            eps=s.rms_norm_eps,
            max_tokens=min((t for t in thresholds if t is not None), default=None),
        )

    def applies(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """A step of decode tokens only, attended by the native kernel, of fewer tokens than the layers
        dequantize for."""
        decode_only = meta.native_decode and meta.num_decodes == num_tokens and not meta.prefills
        return decode_only and (self.max_tokens is None or num_tokens < self.max_tokens)

    def run(
        self,
        hidden: torch.Tensor,  # [T, E] embedded tokens; on return the last layer's residual stream
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> None:
        k_caches, v_caches = self._split_pools(kv_caches)
        self.ops.decode_layers(
            hidden,
            torch.empty_like(hidden),
            positions,
            cos,
            sin,
            k_caches,
            v_caches,
            meta.decode_block_tables,
            meta.decode_context_lens,
            meta.slot_mapping,
            self.input_norms,
            self.post_norms,
            self.qkv,
            self.o_proj,
            self.gate_up,
            self.down,
            self.num_heads,
            self.num_kv_heads,
            self.linear,
            padded_rows(len(hidden)) if self.linear == "onednn" else len(hidden),
            self.eps,
        )

    def _split_pools(self, kv_caches: list) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The K and V pools as two lists, kept while the runner passes the same pool list each step."""
        if self._pools is None or self._pools[0] is not kv_caches:
            self._pools = (kv_caches, [k for k, _ in kv_caches], [v for _, v in kv_caches])
        return self._pools[1], self._pools[2]
