"""Every decoder layer of a decode-only step in one native call (worker/kernels/decode_layers.cpp).

At one stream the 135M model's int4 decode step spent about a third of its time in Python and small torch
ops between the kernels; the op chains the same kernels in C++, so it gives the same numbers. It covers the
case it was built for: the plain Llama layer in float32, every linear on one native quantized kernel (all
int4 or all int8; no bias), decode tokens only. Anything else keeps
`_forward_native`'s per-layer loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.model.attention import AttentionMetadata

# Linear backend -> (weight bits the op is told, the layer's tensors it is given, in order, the layer's
# attribute holding the rows from which it leaves the native kernel: None there means never). w8a8 layers
# ("native-w8a8") run the project's integer GEMM at every row count, which this op does not chain, so they
# keep the per-layer loop.
_NATIVE_LINEARS = {
    "native-int4": (4, ("weight", "scales", "mins"), "dequantize_from"),
    "native-int8": (8, ("weight", "scales"), "dequantize_from"),
}


@dataclass
class DecodeLayers:
    """The op and the model's weights as the TensorLists it takes, gathered once per model."""

    ops: object  # torch.ops.llmserve
    weight_bits: int
    input_norms: list[torch.Tensor]
    post_norms: list[torch.Tensor]
    qkv: list[torch.Tensor]  # each layer's tensors (_NATIVE_LINEARS), layer after layer
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
        apply: a build without the op, a dtype other than float32, a layer beyond plain Llama, a linear not
        on the native int4/int8 kernel, linears of both kinds, or a bias."""
        if ops is None or not hasattr(ops, "decode_layers") or model.embed.dtype != torch.float32:
            return None
        if not model.supports_native_kernels or model.activation != "silu":
            return None
        roles = ("qkv", "o_proj", "gate_up", "down")
        linears = [getattr(layer, role) for layer in model.layers for role in roles]
        backends = {getattr(linear, "backend", None) for linear in linears}
        if len(backends) != 1 or not backends <= _NATIVE_LINEARS.keys():
            return None
        if any(linear.bias is not None for linear in linears):
            return None
        bits, names, leaves_at = _NATIVE_LINEARS[backends.pop()]
        thresholds = [getattr(linear, leaves_at) for linear in linears]

        def tensors(role: str) -> list[torch.Tensor]:
            return [getattr(getattr(layer, role), name) for layer in model.layers for name in names]

        s = model.shape
        return cls(
            ops,
            bits,
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
            self.weight_bits,
            self.eps,
        )

    def _split_pools(self, kv_caches: list) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The K and V pools as two lists, kept while the runner passes the same pool list each step."""
        if self._pools is None or self._pools[0] is not kv_caches:
            self._pools = (kv_caches, [k for k, _ in kv_caches], [v for _, v in kv_caches])
        return self._pools[1], self._pools[2]
