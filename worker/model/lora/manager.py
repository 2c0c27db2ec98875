"""The engine's LoRA state: the adapter registry, the check of each adapter against the served model, and
each step's per-token adapter index handed to the LoRA layers."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from worker.engine.lora_config import LoraConfig
from worker.engine.lora_registry import LoraRef, LoraRegistry, LoraUnavailableError
from worker.model.lora.adapter import BaseModelSpec, LoraAdapter, adapter_digest, load_adapter
from worker.model.lora.layers import LoraStepContext, wrap_model_layers

log = logging.getLogger(__name__)


def base_model_spec(name: str, model: object, intermediate_size: int) -> BaseModelSpec:
    """Each supported module's [out, in] shape on the served model (an adapter must match them)."""
    s = model.shape
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    shapes = {
        "q_proj": (q, s.hidden_size),
        "k_proj": (kv, s.hidden_size),
        "v_proj": (kv, s.hidden_size),
        "o_proj": (s.hidden_size, q),
        "gate_proj": (intermediate_size, s.hidden_size),
        "up_proj": (intermediate_size, s.hidden_size),
        "down_proj": (s.hidden_size, intermediate_size),
    }
    return BaseModelSpec(name=name, num_layers=s.num_layers, module_shapes=shapes)


class LoraManager:
    def __init__(
        self, config: LoraConfig, base: BaseModelSpec, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.config = config
        self.base = base
        self.dtype = dtype
        self.device = device
        self.context = LoraStepContext()
        self.registry: LoraRegistry[LoraAdapter] = LoraRegistry(
            config.max_cpu_loras, self._load, adapter_digest
        )

    def _load(self, name: str, path: str) -> LoraAdapter:
        return load_adapter(name, path, self.base, self.config.max_lora_rank, self.dtype, self.device)

    def attach(self, model: object) -> None:
        wrap_model_layers(model, self.context)

    def load_startup_modules(self) -> None:
        for name, path in self.config.modules().items():
            ref = self.registry.add(name, path)
            log.info("LoRA adapter %s loaded from %s (id %d, digest %s)", name, path, ref.lora_id, ref.digest)

    def prepare_step(self, num_new_tokens: Sequence[int], refs: Sequence[LoraRef | None]) -> list[int]:
        """Per token of the step (items in batch order), the index of its adapter among this step's
        adapters, -1 for the base model; the row groups go to the layers' context."""
        # Slots in adapter-id order, so a step with the same adapters as the last one reuses its stacks.
        distinct = sorted(
            {ref.lora_id: ref for ref in refs if ref is not None}.values(), key=lambda r: r.lora_id
        )
        slots: dict[int, int] = {}
        adapters: list[LoraAdapter] = []
        for ref in distinct:
            try:
                adapters.append(self.registry.get(ref))
            except (ValueError, OSError) as exc:  # LoraAdapterError is a ValueError
                raise LoraUnavailableError(ref, str(exc)) from exc
            slots[ref.lora_id] = len(adapters) - 1
        index: list[int] = []
        for count, ref in zip(num_new_tokens, refs, strict=True):
            index.extend([-1 if ref is None else slots[ref.lora_id]] * count)
        groups: list[tuple[LoraAdapter, torch.Tensor | None]] = []
        if adapters:
            mapping = torch.tensor(index)
            for slot, adapter in enumerate(adapters):
                rows = (mapping == slot).nonzero().flatten()
                groups.append((adapter, None if len(rows) == len(index) else rows.to(self.device)))
        self.context.set(len(index), groups)
        return index
