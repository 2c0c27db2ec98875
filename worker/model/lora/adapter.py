"""Read a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) without peft, check it fits
the served model, and lay its weights out for the engine's fused projections.

The engine fuses q/k/v into one `qkv` product and gate/up into one `gate_up` (worker/model/model.py), so an
adapter's per-module factors are fused the same way: the A matrices of q, k and v are stacked ([3r, in])
and their B matrices placed block-diagonally ([q+k+v out, 3r]), with the scaling folded into B. One
product pair per fused projection then gives exactly the sum of the per-module LoRA updates.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

import torch

# Fused projection -> the Hugging Face modules it holds, in the order of its output rows.
FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
SUPPORTED_MODULES = frozenset(m for mods in FUSED_MODULES.values() for m in mods)
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


class LoraAdapterError(ValueError):
    """The adapter cannot be served on this model; the message says why."""


@dataclass(frozen=True)
class BaseModelSpec:
    """What an adapter must match: the served model's name and each module's [out, in] shape."""

    name: str  # the base model's directory or hub name
    num_layers: int
    module_shapes: dict[str, tuple[int, int]]  # "q_proj" -> (out, in)


@dataclass
class FusedLoraWeights:
    """One fused projection of one layer: delta(x) = (x @ a.T) @ b.T."""

    a: torch.Tensor  # [rank_total, in]
    b: torch.Tensor  # [out, rank_total], scaling folded in


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    layers: list[dict[str, FusedLoraWeights]]  # per layer: fused projection -> weights (absent: no LoRA)

    @property
    def num_bytes(self) -> int:
        return sum(w.a.nbytes + w.b.nbytes for layer in self.layers for w in layer.values())


def read_adapter_config(path: str) -> dict:
    config_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config_path):
        raise LoraAdapterError(f"{path}: no adapter_config.json (a PEFT LoRA adapter directory is expected)")
    try:
        with open(config_path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise LoraAdapterError(f"{config_path}: not readable JSON: {exc}") from None


def check_adapter_config(config: dict, base: BaseModelSpec, max_rank: int, path: str) -> None:
    """Refuse what the engine does not compute: other methods, DoRA, embeddings or other modules, extra
    trained modules, biases, per-module ranks, ranks above the maximum, another base model."""
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise LoraAdapterError(f"{path}: peft_type {peft_type or None!r} is not supported (LORA only)")
    if config.get("use_dora"):
        raise LoraAdapterError(f"{path}: DoRA adapters (use_dora) are not supported")
    for key in ("modules_to_save", "trainable_token_indices", "rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise LoraAdapterError(f"{path}: {key} is not supported (got {config[key]!r})")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise LoraAdapterError(f"{path}: LoRA biases are not supported (bias must be 'none')")
    if config.get("fan_in_fan_out"):
        raise LoraAdapterError(f"{path}: fan_in_fan_out (Conv1D layers) is not supported")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets] if targets in SUPPORTED_MODULES else None  # a regex: checked on the weights
    if targets is not None:
        extra = sorted(set(targets) - SUPPORTED_MODULES)
        if extra:
            raise LoraAdapterError(
                f"{path}: target modules {extra} are not supported; supported: {sorted(SUPPORTED_MODULES)}"
            )
    rank = int(config.get("r", 0))
    if rank < 1:
        raise LoraAdapterError(f"{path}: rank r must be positive, got {rank}")
    if rank > max_rank:
        raise LoraAdapterError(
            f"{path}: rank {rank} is above the maximum LoRA rank {max_rank} (WORKER_MAX_LORA_RANK)"
        )
    adapter_base = config.get("base_model_name_or_path")
    if adapter_base and _model_id(adapter_base) != _model_id(base.name):
        raise LoraAdapterError(
            f"{path}: the adapter was trained on {adapter_base!r}, but this worker serves {base.name!r}"
        )


def adapter_digest(path: str) -> str:
    """The adapter's content identity: sha256 over its config and weights files (what decides its output),
    first 16 hex chars. The same files give the same digest on any worker; retrained weights another."""
    digest = hashlib.sha256()
    for file_name in ("adapter_config.json", "adapter_model.safetensors"):
        file_path = os.path.join(path, file_name)
        try:
            size = os.path.getsize(file_path)
            digest.update(f"{file_name}:{size}:".encode())  # each file framed: no two layouts hash alike
            with open(file_path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError as exc:
            raise LoraAdapterError(f"{path}: {file_name} is not readable: {exc}") from None
    return digest.hexdigest()[:16]


def _model_id(name: str) -> str:
    """A model's name without its directory or hub owner: 'models/SmolLM2-135M-Instruct' and
    'HuggingFaceTB/SmolLM2-135M-Instruct' name the same base model."""
    return os.path.basename(os.path.normpath(name)).lower()


def load_adapter(
    name: str, path: str, base: BaseModelSpec, max_rank: int, dtype: torch.dtype, device: str | torch.device
) -> LoraAdapter:
    """Read, check and fuse an adapter; LoraAdapterError with the reason when it cannot be served."""
    from safetensors import safe_open

    config = read_adapter_config(path)
    check_adapter_config(config, base, max_rank, path)
    weights_path = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(weights_path):
        raise LoraAdapterError(f"{path}: no adapter_model.safetensors")
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    factors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(weights_path, framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            match = _KEY.fullmatch(key)
            if match is None:
                raise LoraAdapterError(
                    f"{path}: weight {key!r} is not a LoRA factor of an attention or MLP projection "
                    f"(supported modules: {sorted(SUPPORTED_MODULES)}; embeddings and other layers are not)"
                )
            layer, module, which = int(match[1]), match[2], match[3]
            if module not in SUPPORTED_MODULES:
                raise LoraAdapterError(f"{path}: target module {module!r} ({key}) is not supported")
            if layer >= base.num_layers:
                raise LoraAdapterError(f"{path}: {key} names layer {layer}; the model has {base.num_layers}")
            factors.setdefault((layer, module), {})[which] = f.get_tensor(key).float()
    if not factors:
        raise LoraAdapterError(f"{path}: adapter_model.safetensors holds no LoRA weights")
    layers = [
        _fuse_layer(factors, i, base, rank, scaling, path, dtype, device) for i in range(base.num_layers)
    ]
    return LoraAdapter(name=name, path=path, rank=rank, layers=layers)


def _fuse_layer(
    factors: dict[tuple[int, str], dict[str, torch.Tensor]],
    layer: int,
    base: BaseModelSpec,
    rank: int,
    scaling: float,
    path: str,
    dtype: torch.dtype,
    device: str | torch.device,
) -> dict[str, FusedLoraWeights]:
    fused: dict[str, FusedLoraWeights] = {}
    for projection, modules in FUSED_MODULES.items():
        present = [m for m in modules if (layer, m) in factors]
        if not present:
            continue
        in_features = base.module_shapes[modules[0]][1]
        out_sizes = [base.module_shapes[m][0] for m in modules]
        a = torch.zeros(rank * len(present), in_features)
        b = torch.zeros(sum(out_sizes), rank * len(present))
        column = 0
        for module, out_offset, out_size in zip(modules, _offsets(out_sizes), out_sizes, strict=True):
            pair = factors.get((layer, module))
            if pair is None:
                continue
            if set(pair) != {"A", "B"}:
                raise LoraAdapterError(f"{path}: layer {layer} {module} lacks lora_{'AB'[('A' in pair)]}")
            expected_a, expected_b = (rank, in_features), (out_size, rank)
            if tuple(pair["A"].shape) != expected_a or tuple(pair["B"].shape) != expected_b:
                raise LoraAdapterError(
                    f"{path}: layer {layer} {module}: lora_A {tuple(pair['A'].shape)} / lora_B "
                    f"{tuple(pair['B'].shape)} do not fit this model (expected {expected_a} / {expected_b}); "
                    "was the adapter trained on another base model?"
                )
            a[column : column + rank] = pair["A"]
            b[out_offset : out_offset + out_size, column : column + rank] = pair["B"] * scaling
            column += rank
        fused[projection] = FusedLoraWeights(
            a.to(device, dtype).contiguous(), b.to(device, dtype).contiguous()
        )
    return fused


def _offsets(sizes: list[int]) -> list[int]:
    out, total = [], 0
    for size in sizes:
        out.append(total)
        total += size
    return out
