"""A Llama-family decoder run by the engine itself: one flat batch of tokens, paged attention.

Weights are taken from a transformers model (so anything transformers loads, a local directory or a
GGUF conversion, works); the forward pass is ours. Q/K/V and gate/up projections are fused into one
matmul each.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from common.hugepages import WEIGHTS
from common.linear import Linear
from worker.model.attention import AttentionMetadata, paged_attention
from worker.model.decode_layers import DecodeLayers
from worker.model.quant import Int4Groups, Int4Linear, Int8Linear, build_linear
from worker.model.w8a8 import quantized_head_rows

# What the forward pass implements beyond the plain Llama layer. The weight gathering below records what
# each model needs (`LlamaForPagedAttention.needs`); the loader refuses a model that needs anything not
# listed here (worker/model/loader.py), so a family is served only once the forward computes it. Needs:
#   qk_norm         RMSNorm of each head of q and of k (LayerWeights.q_norm / k_norm, [head_dim]) after
#                   the QKV projection, before rotary
#   sandwich_norms  LayerWeights.post_attn_norm on o_proj's output and post_mlp_norm on down's output, each
#                   before its residual add (post_norm stays the norm in front of the MLP)
#   gelu_tanh       the gated activation is gelu(gate, approximate="tanh") * up instead of silu(gate) * up
#   per_layer_rope  LayerWeights.rope = (cos, sin) tables for that layer instead of the model's cos/sin
#   sliding_window  LayerWeights.sliding_window = W: a query at position p sees keys at (p - W, p] only
# Folded into the weights at load, so the forward needs nothing for them: Gemma's (1 + w) norm scales, the
# embedding scale, Gemma's query_pre_attn_scalar.
FORWARD_FEATURES: frozenset[str] = frozenset(
    {"qk_norm", "sandwich_norms", "gelu_tanh", "per_layer_rope", "sliding_window"}
)

# RMSNorms that scale by (1 + weight) (Gemma's); folded into plain weights at load.
UNIT_OFFSET_NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # hidden -> (H + 2 KV) * D
    o_proj: Linear
    post_norm: torch.Tensor  # the norm in front of the MLP
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear
    # Only for families that need them (see FORWARD_FEATURES); None for Llama.
    q_norm: torch.Tensor | None = None  # [head_dim]
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # on o_proj's output, before the residual add
    post_mlp_norm: torch.Tensor | None = None  # on down's output, before the residual add
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # this layer's cos/sin; None: the model's
    sliding_window: int | None = None  # keys at (p - W, p] only; None: all before p


def _norm_weight(norm: torch.nn.Module) -> torch.Tensor:
    """The multiplier of an RMSNorm's normalized input: its weight, or 1 + weight for Gemma's."""
    weight = norm.weight.detach()
    if type(norm).__name__ in UNIT_OFFSET_NORMS:
        return (1.0 + weight.float()).to(weight.dtype)
    return _own_copy(weight)


def _own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor the model keeps, copied out of the loaded checkpoint (onto huge pages where allowed).

    transformers maps the safetensors file and its parameters are views of that mapping: one view kept by
    the model (the embedding table, a norm's weight) kept all of it mapped for the worker's life, and with it
    every page written at load. w8a8's smoothing writes most of them, so a worker held 340 MB of such copies
    it never read again, plus 170 MB of the file (135M model, AVX2 EPYC: resident 2448 -> 2014 MB with w8a8,
    2913 -> 2500 in float32). Copied, the mapping goes with the loaded model once the engine's weights are
    built (tests/engine/test_model_memory.py)."""
    return WEIGHTS.copy(tensor) if tensor.device.type == "cpu" else tensor


class _PositionTables:
    """cos/sin rows for one step's positions, selected once per table (layers share the model's table;
    Gemma's local layers share theirs)."""

    def __init__(self, positions: torch.Tensor) -> None:
        self.positions = positions
        self.selected: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def select(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = id(cos)
        if key not in self.selected:
            self.selected[key] = (
                cos.index_select(0, self.positions).unsqueeze(1),  # [T, 1, D]
                sin.index_select(0, self.positions).unsqueeze(1),
            )
        return self.selected[key]


@dataclass
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float


class LlamaForPagedAttention:
    use_decode_layers = True  # False: decode steps take the per-layer loop too (tests, timing checks)

    def __init__(
        self,
        hf_model: torch.nn.Module,
        max_positions: int,
        linear_backend: str = "auto",
        quantization: str = "none",
        int4_groups: dict[str, Int4Groups] | None = None,
    ) -> None:
        """`quantization`: none | int8 | int4 (weight-only, worker/model/quant.py) | w8a8 | w4a8 (integer
        rows too: w8a8.py, w4a8.py); `int4_groups`: 4-bit blocks already in a GGUF file, by Hugging Face
        name, used instead of re-quantizing (int4 and w4a8)."""
        config = hf_model.config
        self.shape = ModelShape(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            vocab_size=config.vocab_size,
            rms_norm_eps=config.rms_norm_eps,
        )
        inner = hf_model.model
        self.needs: set[str] = set()  # forward features this model needs beyond Llama's (FORWARD_FEATURES)
        embed = inner.embed_tokens.weight.detach()
        embed_scale = getattr(inner.embed_tokens, "embed_scale", None)  # Gemma scales the embeddings
        if embed_scale is not None:
            self.embed = embed * embed_scale.to(embed.dtype)  # a copy already: the LM head stays unscaled
        else:
            self.embed = _own_copy(embed)
        self.final_norm = _norm_weight(inner.norm)
        self.quantization = quantization
        # The LM head is 8-bit with weight-only quantization, as llama.cpp's Q4_1 file keeps it (Q8_0). With
        # w8a8 in bfloat16 its rows stay unquantized: 8-bit rows with one scale each (oneDNN's then) cost the
        # 135M model 1% of perplexity on their own (docs/STUDY_LOG.md), and it sees only the rows whose logits
        # are wanted. Its weights are 8-bit where the model runs in float32 (AVX2 kinds): a float32 head was
        # 113 MB read every decode step, 5 of a one-stream step's 11 ms (AVX2 EPYC); on the AVX2 kernel its
        # rows are quantized too (`quantized_head_rows`: 7-bit rows, a scale per 32 columns).
        float_rows = (
            hf_model.lm_head.weight.dtype == torch.float32 and hf_model.lm_head.weight.device.type == "cpu"
        )
        integer_rows = quantization in ("w8a8", "w4a8")  # the decoder layers quantize their rows
        int8_head = quantization in ("int8", "int4") or (integer_rows and float_rows)
        head_quantization = "int8" if int8_head else "none"
        if integer_rows and quantized_head_rows(hf_model.lm_head.weight):  # float32 rows only
            head_quantization = "w8a8"
        self.lm_head = build_linear(hf_model.lm_head.weight, None, linear_backend, head_quantization)
        if head_quantization == "int8":
            # It sees one row per sequence, where dequantizing its 28M weights each step costs more than the
            # native kernel's whole product (32 rows: 6.6 ms on its panel GEMM).
            self.lm_head.dequantize_from = None
        self.activation = self._activation(config)
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(config, name, None):
                self.needs.add(name)
        # SDPA scales scores by head_dim ** -0.5; a model that wants another scale gets it folded into q.
        query_scalar = getattr(config, "query_pre_attn_scalar", None)
        q_scale = math.sqrt(self.shape.head_dim / query_scalar) if query_scalar else 1.0
        self.layers = [
            self._layer(layer, linear_backend, quantization, int4_groups or {}, f"model.layers.{i}.", q_scale)
            for i, layer in enumerate(inner.layers)
        ]
        # What the start log names: the head's backend, which is the layers' too, except with integer rows.
        layers_backend = self.layers[0].qkv.backend if integer_rows and self.layers else None
        self.linear_backend = layers_backend or self.lm_head.backend
        self.cos, self.sin = self._rope_tables(inner, max_positions)
        for layer in self.layers:
            if layer.q_norm is not None:
                self.needs.add("qk_norm")
            if layer.post_attn_norm is not None:
                self.needs.add("sandwich_norms")
            if layer.rope is not None:
                self.needs.add("per_layer_rope")
            if layer.sliding_window is not None and layer.sliding_window < max_positions:
                self.needs.add("sliding_window")
            else:
                layer.sliding_window = None  # a window as long as the context changes nothing

    def missing_forward_features(self) -> list[str]:
        """What this model needs that the forward pass does not compute yet (empty: it can be served)."""
        return sorted(self.needs - FORWARD_FEATURES)

    def _activation(self, config: object) -> str:
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
        if act == "silu":
            return "silu"
        if act in ("gelu_pytorch_tanh", "gelu_tanh"):
            self.needs.add("gelu_tanh")
            return "gelu_tanh"
        self.needs.add(f"activation {act}")
        return act

    @staticmethod
    def _layer(
        layer: torch.nn.Module,
        backend: str,
        quantization: str,
        int4_groups: dict[str, Int4Groups],
        prefix: str,
        q_scale: float = 1.0,
    ) -> LayerWeights:
        attn = layer.self_attn
        q_norm = _norm_weight(attn.q_norm) if hasattr(attn, "q_norm") else None
        k_norm = _norm_weight(attn.k_norm) if hasattr(attn, "k_norm") else None
        if q_scale != 1.0 and q_norm is not None:
            q_norm = q_norm * q_scale
        scale_q = q_scale != 1.0 and q_norm is None  # else the q rows of the projection carry it

        def linear(names: list[str], bias: torch.Tensor | None = None) -> Linear | Int8Linear | Int4Linear:
            modules = [layer.get_submodule(name) for name in names]
            weights = [m.weight.detach() for m in modules]
            if scale_q and names[0] == "self_attn.q_proj":
                weights[0] = weights[0] * q_scale
            weight = torch.cat(weights) if len(weights) > 1 else weights[0]
            groups = [int4_groups.get(f"{prefix}{name}.weight") for name in names]
            four_bit = quantization in ("int4", "w4a8")
            fused = Int4Groups.cat(groups) if four_bit and all(groups) and not scale_q else None
            return build_linear(weight, bias, backend, quantization, fused)

        bias = None
        if attn.q_proj.bias is not None:
            q_bias = attn.q_proj.bias * q_scale if scale_q else attn.q_proj.bias
            bias = torch.cat([q_bias, attn.k_proj.bias, attn.v_proj.bias]).detach()
        # Gemma's "sandwich": post_attention_layernorm is on the attention output, and the MLP has its own
        # pre- and post-norms; in Llama post_attention_layernorm is the norm in front of the MLP.
        sandwich = hasattr(layer, "pre_feedforward_layernorm")
        return LayerWeights(
            input_norm=_norm_weight(layer.input_layernorm),
            qkv=linear(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], bias),
            o_proj=linear(["self_attn.o_proj"]),
            post_norm=_norm_weight(
                layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm
            ),
            gate_up=linear(["mlp.gate_proj", "mlp.up_proj"]),
            down=linear(["mlp.down_proj"]),
            q_norm=q_norm,
            k_norm=k_norm,
            post_attn_norm=_norm_weight(layer.post_attention_layernorm) if sandwich else None,
            post_mlp_norm=_norm_weight(layer.post_feedforward_layernorm) if sandwich else None,
            sliding_window=getattr(attn, "sliding_window", None),
        )

    def _rope_tables(self, inner: torch.nn.Module, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for every position, from transformers' own rotary module (any rope type). A model whose
        layer types have rotary tables of their own (Gemma 3: local and global) gets them per layer."""
        probe = self.embed[:1].unsqueeze(0)
        positions = torch.arange(max_positions, device=self.embed.device).unsqueeze(0)
        layer_types = getattr(inner.config, "layer_types", None)
        per_type = layer_types and "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
        with torch.no_grad():
            if not per_type:
                cos, sin = inner.rotary_emb(probe, positions)
                return cos[0], sin[0]
            tables = {t: inner.rotary_emb(probe, positions, t) for t in dict.fromkeys(layer_types)}
        default = "full_attention" if "full_attention" in tables else layer_types[0]
        for layer, layer_type in zip(self.layers, layer_types, strict=True):
            if layer_type != default:
                cos, sin = tables[layer_type]
                layer.rope = (cos[0], sin[0])
        cos, sin = tables[default]
        return cos[0], sin[0]

    # ---- forward -------------------------------------------------------------------------
    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.shape.rms_norm_eps)
        return weight * x32.to(dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def use_native_kernels(self, ops: object | None) -> None:
        """Run norms, rotary and the gated activation through the compiled kernels (`torch.ops.llmserve`).
        The fused path is the plain Llama layer; a model needing more (FORWARD_FEATURES) keeps the torch
        forward, and the runner keeps its attention on the torch backend (`supports_native_kernels`)."""
        if ops is not None and not self.supports_native_kernels:
            raise ValueError(
                f"the native kernels run the Llama layer only; this model needs {sorted(self.needs)}"
            )
        self.native_ops = ops
        self.__dict__.pop("decode_layers", None)  # gathered again for these ops on first use

    @cached_property
    def decode_layers(self) -> DecodeLayers | None:
        """All layers of a decode-only step in one native call (worker/model/decode_layers.py), or None where
        this model or build cannot use it; its weight lists are gathered on first use."""
        return DecodeLayers.build(self, getattr(self, "native_ops", None))

    @property
    def supports_native_kernels(self) -> bool:
        return not self.needs

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor | None,  # rows whose logits are wanted; None: all
    ) -> torch.Tensor:
        if getattr(self, "native_ops", None) is not None:
            return self._forward_native(input_ids, positions, meta, kv_caches, logits_indices)
        s = self.shape
        num_tokens = input_ids.shape[0]
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        rope = _PositionTables(positions)
        hidden = F.embedding(input_ids, self.embed)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            cos, sin = rope.select(*(layer.rope or (self.cos, self.sin)))
            residual = hidden
            x = self._rms_norm(hidden, layer.input_norm)
            qkv = layer.qkv(x)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(num_tokens, s.num_heads, s.head_dim)
            k = k.view(num_tokens, s.num_kv_heads, s.head_dim)
            if layer.q_norm is not None:
                q, k = self._rms_norm(q, layer.q_norm), self._rms_norm(k, layer.k_norm)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            v = v.reshape(num_tokens, s.num_kv_heads, s.head_dim)
            attn = paged_attention(q, k, v, k_cache, v_cache, meta, layer.sliding_window)
            out = layer.o_proj(attn.view(num_tokens, q_size))
            if layer.post_attn_norm is not None:
                out = self._rms_norm(out, layer.post_attn_norm)
            hidden = residual + out
            residual = hidden
            x = self._rms_norm(hidden, layer.post_norm)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            act = F.gelu(gate, approximate="tanh") if self.activation == "gelu_tanh" else F.silu(gate)
            out = layer.down(act * up)
            if layer.post_mlp_norm is not None:
                out = self._rms_norm(out, layer.post_mlp_norm)
            hidden = residual + out
        if logits_indices is not None:
            hidden = hidden.index_select(0, logits_indices)
        hidden = self._rms_norm(hidden, self.final_norm)
        return self.lm_head(hidden)

    def _forward_native(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor | None,
    ) -> torch.Tensor:
        """The same computation as `forward`, with each layer's small steps fused: the residual add and
        the next norm are one pass, rotary is applied in place on the fused QKV rows, and the gated
        activation is one pass; q/k/v stay views into the QKV output."""
        ops, s = self.native_ops, self.shape
        num_tokens = input_ids.shape[0]
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        eps = s.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)  # the residual stream, updated in place
        if self.use_decode_layers and self.decode_layers and self.decode_layers.applies(meta, num_tokens):
            self.decode_layers.run(hidden, positions, self.cos, self.sin, kv_caches, meta)  # every layer
            return self._logits(hidden, logits_indices)
        x = torch.empty_like(hidden)
        ops.rms_norm(hidden, self.layers[0].input_norm, eps, x)
        last = len(self.layers) - 1
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            qkv = layer.qkv(x)
            ops.rotary_(qkv, positions, self.cos, self.sin, s.num_heads + s.num_kv_heads)
            q = qkv[:, :q_size].view(num_tokens, s.num_heads, s.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(num_tokens, s.num_kv_heads, s.head_dim)
            v = qkv[:, q_size + kv_size :].view(num_tokens, s.num_kv_heads, s.head_dim)
            attn = paged_attention(q, k, v, k_cache, v_cache, meta)
            ops.add_rms_norm(layer.o_proj(attn.view(num_tokens, q_size)), hidden, layer.post_norm, eps, x)
            act = self._gated_activation(layer.gate_up, x)
            down = layer.down(act)
            if i < last:
                ops.add_rms_norm(down, hidden, self.layers[i + 1].input_norm, eps, x)
            else:
                hidden += down
        return self._logits(hidden, logits_indices)

    def _gated_activation(self, gate_up: Linear, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the [gate; up] projection of x: in one pass where the layer has one (AMX tiles,
        LoRA-wrapped too on a step without adapter rows; quantized and oneDNN layers have none), else the
        product and then the native silu_and_mul."""
        fused = getattr(gate_up, "silu_and_mul", None)
        act = fused(x) if fused is not None else None
        if act is None:
            product = gate_up(x)
            act = product.new_empty(x.shape[0], product.shape[1] // 2)
            self.native_ops.silu_and_mul(product, act)
        return act

    def _logits(self, hidden: torch.Tensor, logits_indices: torch.Tensor | None) -> torch.Tensor:
        """The final norm and the LM head over the wanted rows of the last residual stream (native path)."""
        if logits_indices is not None:
            hidden = hidden.index_select(0, logits_indices)
        out = torch.empty_like(hidden)
        self.native_ops.rms_norm(hidden, self.final_norm, self.shape.rms_norm_eps, out)
        return self.lm_head(out)
