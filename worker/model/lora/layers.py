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
    """This step's adapters and, for each, the rows it applies to (None: every row).

    With several adapters (or the base model beside one), each projection runs two products over all rows
    instead of a gather, two products and a scatter per adapter: the adapters' A matrices stacked
    ([sum of ranks, in]) and their B matrices side by side ([out, sum of ranks]), with a 0/1 mask between
    them keeping each row to its own adapter's columns. The stacks are built once for a set of adapters
    and kept while the steps keep that set."""

    num_tokens: int = 0
    groups: list[tuple[LoraAdapter, torch.Tensor | None]] = field(default_factory=list)
    _adapters: tuple[LoraAdapter, ...] = ()  # the adapters the stacks were built for, in slot order
    _stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, tuple] | None] = field(
        default_factory=dict
    )
    _masks: dict[tuple, torch.Tensor] = field(default_factory=dict)  # this step's, per column layout

    def set(self, num_tokens: int, groups: list[tuple[LoraAdapter, torch.Tensor | None]]) -> None:
        self.num_tokens, self.groups = num_tokens, groups
        adapters = tuple(adapter for adapter, _ in groups)
        # by identity: a reloaded adapter is a new object (and holding these keeps ids from being reused)
        if len(adapters) != len(self._adapters) or any(
            new is not old for new, old in zip(adapters, self._adapters, strict=True)
        ):
            self._adapters, self._stacks = adapters, {}
        self._masks = {}

    def stacked(self, layer: int, projection: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """This step's adapters on one projection: (A stacked, B side by side, the row/column mask), or
        None when none of them has this projection."""
        key = (layer, projection)
        if key not in self._stacks:
            parts = [
                (slot, weights)
                for slot, (adapter, _) in enumerate(self.groups)
                if (weights := adapter.layers[layer].get(projection)) is not None
            ]
            self._stacks[key] = (
                (
                    torch.cat([w.a for _, w in parts]),
                    torch.cat([w.b for _, w in parts], dim=1),
                    tuple((slot, w.a.shape[0]) for slot, w in parts),
                )
                if parts
                else None
            )
        stack = self._stacks[key]
        if stack is None:
            return None
        a, b, layout = stack
        mask = self._masks.get(layout)
        if mask is None:
            mask = self._masks[layout] = self._mask(layout, a)
        return a, b, mask

    def _mask(self, layout: tuple, like: torch.Tensor) -> torch.Tensor:
        """[rows, columns]: 1 where a column belongs to the row's adapter, else 0 (all 0 on base rows)."""
        row_slots = torch.full((self.num_tokens,), -1, dtype=torch.long, device=like.device)
        for slot, (_, rows) in enumerate(self.groups):
            if rows is None:
                row_slots.fill_(slot)
            else:
                row_slots[rows] = slot
        column_slots = torch.cat(
            [torch.full((width,), slot, dtype=torch.long, device=like.device) for slot, width in layout]
        )
        return (row_slots[:, None] == column_slots[None, :]).to(like.dtype)


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

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """The base layer's one-pass gated activation (common/linear.py `Linear.silu_and_mul`) on a step
        without adapter rows; None on a step with any, whose low-rank products go between the projection and
        the activation (the model then runs the two steps)."""
        fused = getattr(self.base, "silu_and_mul", None)
        return fused(x) if fused is not None and not self.context.groups else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        groups = self.context.groups
        if not groups:
            return out
        if x.shape[0] != self.context.num_tokens:
            raise RuntimeError(
                f"LoRA step context is for {self.context.num_tokens} rows, the layer got {x.shape[0]}"
            )
        if len(groups) == 1 and groups[0][1] is None:  # one adapter on every row: no mask needed
            weights = groups[0][0].layers[self.layer_index].get(self.projection)
            if weights is not None:
                out.add_(((x.to(weights.a.dtype) @ weights.a.T) @ weights.b.T).to(out.dtype))
            return out
        stack = self.context.stacked(self.layer_index, self.projection)
        if stack is not None:
            a, b, mask = stack
            low_rank = (x.to(a.dtype) @ a.T).mul_(mask)
            out.add_((low_rank @ b.T).to(out.dtype))
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
