"""A cross-encoder over the packaged all-MiniLM-L6-v2: reads two questions *together* and says how likely one
answer serves both.

A sentence vector is computed for each question alone, so "plot of Inception" and "who directed Inception"
land close together. A cross-encoder attends from every word piece of one question to every piece of the
other in all six layers. No cross-encoder ships its weights in a registry package (docs/SEMANTIC_CACHE.md),
so this one is made from the embedding model we already have: low-rank adapters on every linear layer of
its encoder plus a one-unit head over the mean-pooled pair, trained on the tuning split by
`python -m cache_service.verifier_training` and shipped as a ~1 MB file (`verifier_adapter.npz`). At load
the adapters are merged into a private copy of the weights, so scoring costs one plain forward pass.

A pair is scored in both orders ("a [SEP] b" and "b [SEP] a") and the two logits averaged: the verdict
must not depend on which question was stored first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ADAPTER_FILE = Path(__file__).with_name("verifier_adapter.npz")
MAX_PAIR_TOKENS = 128  # two turns of at most MAX_COMPARABLE_CHARS each are cut here; rarely reached
ADAPTED = ("query", "key", "value", "attention_output", "intermediate", "output")


def adapted_linears(encoder: Any) -> Iterator[tuple[str, Any]]:
    """(name, nn.Linear) of every layer the adapters change, in a fixed order."""
    for i, layer in enumerate(encoder.encoder.layer):
        attention = layer.attention
        yield f"{i}.query", attention.self.query
        yield f"{i}.key", attention.self.key
        yield f"{i}.value", attention.self.value
        yield f"{i}.attention_output", attention.output.dense
        yield f"{i}.intermediate", layer.intermediate.dense
        yield f"{i}.output", layer.output.dense


def load_encoder(path: str | None = None) -> tuple[Any, Any]:
    """The packaged MiniLM as a plain transformers encoder and its tokenizer (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    from cache_service.embedder import model_path

    where = path or model_path()
    return AutoModel.from_pretrained(where), AutoTokenizer.from_pretrained(where)


def pair_logits(encoder: Any, tokenizer: Any, head: Any, first: list[str], second: list[str]) -> Any:
    """One logit per pair, read in the given order: mean of the last hidden states over the pair's real
    tokens, then the head."""
    batch = tokenizer(
        first, second, padding=True, truncation=True, max_length=MAX_PAIR_TOKENS, return_tensors="pt"
    )
    hidden = encoder(**batch).last_hidden_state.float()
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return head(pooled.to(head.weight.dtype)).squeeze(-1)


class CrossEncoder:
    """Probability that one answer serves both texts of each pair; thread-compatible (one caller at a time).

    dtype: "float32" or "bfloat16" (as the embedder: bfloat16 only where the CPU computes it natively)."""

    def __init__(
        self,
        adapter: Path | dict[str, np.ndarray] = ADAPTER_FILE,
        dtype: str = "float32",
        path: str | None = None,
    ) -> None:
        import torch

        self._torch = torch
        self._encoder, self._tokenizer = load_encoder(path)
        self._encoder.eval()
        if isinstance(adapter, Path):
            with np.load(adapter) as stored:
                adapter = {k: stored[k] for k in stored.files}
        weights = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in adapter.items()}
        with torch.no_grad():
            for name, linear in adapted_linears(self._encoder):
                linear.weight += weights[f"{name}.b"] @ weights[f"{name}.a"]
            self._head = torch.nn.Linear(weights["head.weight"].shape[1], 1)
            self._head.weight.copy_(weights["head.weight"])
            self._head.bias.copy_(weights["head.bias"])
        if dtype == "bfloat16":
            self._encoder.to(torch.bfloat16)
        from services.linear import pack_linear_layers

        self.packed_layers = pack_linear_layers(self._encoder)

    def probabilities(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        if not pairs:
            return np.zeros(0)
        first = [a for a, _ in pairs]
        second = [b for _, b in pairs]
        with self._torch.inference_mode():
            logits = pair_logits(self._encoder, self._tokenizer, self._head, first + second, second + first)
        both = logits.float().numpy().reshape(2, len(pairs)).astype(np.float64)
        return 1.0 / (1.0 + np.exp(-both.mean(axis=0)))


def lora_init(rank: int, in_features: int, out_features: int, generator: Any) -> tuple[Any, Any]:
    """A low-rank adapter that starts as a no-op: A random (scaled by fan-in), B zero."""
    import torch

    a = torch.randn(rank, in_features, generator=generator) / math.sqrt(in_features)
    return a, torch.zeros(out_features, rank)
