"""What the engine's model keeps of the model transformers loaded: nothing of its memory on a CPU.

transformers maps the safetensors file and its parameters are views of that mapping, so one view kept by the
engine keeps the whole file mapped, with every page written at load (w8a8's smoothing writes most of them).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.engine.factories import tiny_llama
from tests.engine.test_model_families import tiny_gemma3, tiny_qwen2
from worker.model.model import LlamaForPagedAttention


def tensors_of(obj: object, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from `obj` through attributes, dataclass fields and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif dataclasses.is_dataclass(obj):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("worker.", "common.")):
        children = list(vars(obj).values())
    else:
        return []
    return [t for child in children for t in tensors_of(child, seen)]


@pytest.mark.parametrize(
    ("family", "quantization"),
    [(tiny_llama, "none"), (tiny_llama, "int8"), (tiny_qwen2, "none"), (tiny_gemma3, "none")],
    ids=["llama", "llama-int8", "qwen2-biases", "gemma3-scaled-embeddings"],
)
def test_the_model_shares_no_memory_with_the_loaded_checkpoint(family, quantization: str) -> None:
    hf_model = family()
    loaded = {p.untyped_storage().data_ptr() for p in hf_model.parameters()}
    model = LlamaForPagedAttention(hf_model, 64, "auto", quantization)
    # (oneDNN's packed weights are its own copies, and have no storage to compare)
    kept = [t for t in tensors_of(model) if t.device.type == "cpu" and t.numel() and not t.is_mkldnn]
    assert len(kept) > 2 * len(model.layers)  # the norms, the embedding table, the layers' weights
    shared = [tuple(t.shape) for t in kept if t.untyped_storage().data_ptr() in loaded]
    assert not shared, f"views of the loaded parameters kept: {shared}"
