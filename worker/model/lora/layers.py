"""The projections with LoRA: the base layer's product, plus each adapter's low-rank product over the rows
(tokens) of that adapter, as punica/S-LoRA batch them. The base weights are never merged, so requests of
different adapters and of the base model share one step.

    rows of a step:   [ t0  t1  t2  t3  t4  t5 ]     adapter per row: [-1, 0, 0, 1, -1, 0]
    y = base(x);  y[rows of 0] += (x[rows of 0] @ A0.T) @ B0.T;  y[rows of 1] += (x[rows of 1] @ A1.T) @ B1.T

The row groups come from the step's per-token adapter index (`LoraStepContext`), set by the model runner
before each forward pass; each layer reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from worker.model.lora.adapter import LoraAdapter


@dataclass
class LoraStepContext:
    """This step's adapters and, for each, the rows it applies to (None: every row)."""

    num_tokens: int = 0
    groups: list[tuple[LoraAdapter, torch.Tensor | None]] = field(default_factory=list)

    def set(self, num_tokens: int, groups: list[tuple[LoraAdapter, torch.Tensor | None]]) -> None:
        self.num_tokens, self.groups = num_tokens, groups


class LoraLinear:
    """A fused projection of one layer (`Linear`, `Int8Linear`, `Int4Linear`...) with the step's LoRA
    products added; same call interface (2-D rows in and out)."""

    def __init__(
        self,
        base: Callable[[torch.Tensor], torch.Tensor],
        layer_index: int,
        projection: str,
        context: LoraStepContext,
    ) -> None:
        self.base = base
        self.layer_index = layer_index
        self.projection = projection
        self.context = context
        # The fused all-layers decode op (worker/model/decode_layers.py) reads the base weights directly: this
        # backend name keeps it off LoRA layers.
        self.backend = f"lora+{getattr(base, 'backend', 'unknown')}"
        self.bias = getattr(base, "bias", None)
        self.out_features = getattr(base, "out_features", None)
        self.in_features = getattr(base, "in_features", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        groups = self.context.groups
        if not groups:
            return out
        if x.shape[0] != self.context.num_tokens:
            raise RuntimeError(
                f"LoRA step context is for {self.context.num_tokens} rows, the layer got {x.shape[0]}"
            )
        for adapter, rows in groups:
            weights = adapter.layers[self.layer_index].get(self.projection)
            if weights is None:
                continue
            xs = x if rows is None else x.index_select(0, rows)
            delta = (xs.to(weights.a.dtype) @ weights.a.T) @ weights.b.T
            if rows is None:
                out.add_(delta.to(out.dtype))
            else:
                out.index_add_(0, rows, delta.to(out.dtype))
        return out


PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


def wrap_model_layers(model: object, context: LoraStepContext) -> None:
    """Put every layer's fused projections of a LlamaForPagedAttention behind LoraLinear (in place)."""
    for i, layer in enumerate(model.layers):
        for projection in PROJECTIONS:
            base = getattr(layer, projection)
            if not isinstance(base, LoraLinear):
                setattr(layer, projection, LoraLinear(base, i, projection, context))
    model.use_decode_layers = False  # the fused decode op reads base weights only
    model.__dict__.pop("decode_layers", None)
