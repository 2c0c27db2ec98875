"""Smoothing before 8-bit activations (SmoothQuant, Xiao et al. 2023), for `WORKER_QUANTIZATION=w8a8`.

A few input channels of a linear layer carry activations many times larger than the rest, so one 8-bit scale
per row spends its range on them and rounds the others coarsely (perplexity of the 135M model +4% with the
rows quantized as they come). Dividing channel j of the activations by s_j and multiplying column j of the
weight by s_j leaves every product unchanged and moves part of the range into the weight, whose columns
quantize per output channel anyway; s_j = a_j^alpha / w_j^(1 - alpha) from the channel's largest activation
a_j and largest weight w_j, alpha = 0.5 (the paper's default; not fitted here).

The division is folded into what produces the activations, so nothing is added to a step: the RMSNorm in
front of q/k/v and of gate/up (its multiplier), v's rows for o_proj (attention is linear in v; one factor per
kv head and dimension, shared by the query heads of a group), up's rows for down (the gated activation is
linear in up). The largest activations are read once at load time, from the model's own forward pass over a
short calibration text kept beside this file (general prose, never the text perplexity is measured on).
That forward pass is most of smoothing's cost (1.7 s of a worker's start for the 135M model on 2 cores), so
its result is kept in the model directory (`cached_activation_ranges`) for the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from worker.model.model import UNIT_OFFSET_NORMS

log = logging.getLogger(__name__)

ALPHA = 0.5
CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
RANGES_CACHE_DIR = ".llmserve-cache"  # inside the model directory


@torch.no_grad()
def activation_ranges(hf_model: torch.nn.Module, token_ids: list[int]) -> dict[tuple[int, str], torch.Tensor]:
    """Largest |activation| per input channel of q_proj, o_proj, gate_proj and down_proj in every layer, over
    the tokens, from the Hugging Face model's forward pass."""
    ranges: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(hf_model.model.layers):
        for role, module in (
            ("qkv", layer.self_attn.q_proj),
            ("o_proj", layer.self_attn.o_proj),
            ("gate_up", layer.mlp.gate_proj),
            ("down", layer.mlp.down_proj),
        ):

            def record(_module, inputs, _output, key=(i, role)) -> None:
                x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0)
                ranges[key] = torch.maximum(ranges[key], x) if key in ranges else x

            handles.append(module.register_forward_hook(record))
    try:
        ids = torch.tensor([token_ids], device=hf_model.device)
        hf_model.model(input_ids=ids, use_cache=False)  # the decoder only: the head's logits are not needed
    finally:
        for handle in handles:
            handle.remove()
    return ranges


def cached_activation_ranges(
    hf_model: torch.nn.Module, token_ids: list[int], model_dir: str
) -> dict[tuple[int, str], torch.Tensor]:
    """`activation_ranges`, read from the model directory when an earlier start kept them for the same
    weight files (name, size, modification time), config, dtype and tokens; else computed and kept there. A
    directory that cannot be written (a read-only image) only loses the saving."""
    key = _cache_key(hf_model, token_ids, Path(model_dir))
    path = Path(model_dir) / RANGES_CACHE_DIR / f"smoothing-ranges-{key}.safetensors"
    if path.is_file():
        try:
            return {_layer_and_role(name): value for name, value in load_file(path).items()}
        except Exception as exc:  # a damaged file: compute again, and replace it below
            log.warning("smoothing: unreadable cached activation ranges %s (%s)", path, exc)
    ranges = activation_ranges(hf_model, token_ids)
    tmp = None
    try:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, 0o644)  # as the model's own files (mkstemp makes it private)
        save_file({f"{layer}.{role}": value.contiguous() for (layer, role), value in ranges.items()}, tmp)
        os.replace(tmp, path)  # whole or not at all, with several workers starting at once
    except OSError as exc:
        log.info("smoothing: activation ranges not kept in %s (%s)", path.parent, exc)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return ranges


def _layer_and_role(name: str) -> tuple[int, str]:
    layer, role = name.split(".", 1)
    return int(layer), role


def _cache_key(hf_model: torch.nn.Module, token_ids: list[int], model_dir: Path) -> str:
    weights = [f for f in model_dir.iterdir() if f.suffix in (".safetensors", ".bin") and f.is_file()]
    files = sorted((f.name, stat.st_size, stat.st_mtime_ns) for f in weights for stat in [f.stat()])
    material = {
        "files": files,
        "config": hf_model.config.to_dict(),
        "dtype": str(next(hf_model.parameters()).dtype),
        "tokens": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16]


def factors(activations: torch.Tensor, weight_columns: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """s_j = a_j^alpha / w_j^(1 - alpha), float32, with channels that never moved left alone (s = 1)."""
    a = activations.float().clamp(min=1e-5)
    w = weight_columns.float().clamp(min=1e-5)
    s = a.pow(alpha) / w.pow(1 - alpha)
    return torch.where(activations > 0, s, torch.ones_like(s)).clamp(min=1e-5)


@torch.no_grad()
def smooth(
    hf_model: torch.nn.Module, token_ids: list[int], alpha: float = ALPHA, model_dir: str | None = None
) -> None:
    """Rescale the model's weights as the module docstring says; its function is unchanged up to rounding
    (a float32 model gives the same logits). With model_dir, the activation ranges are cached there."""
    ranges = (
        cached_activation_ranges(hf_model, token_ids, model_dir)
        if model_dir is not None
        else activation_ranges(hf_model, token_ids)
    )
    config = hf_model.config
    num_heads, num_kv = config.num_attention_heads, config.num_key_value_heads
    for i, layer in enumerate(hf_model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        pre_mlp = getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm
        for role, norm, consumers in (
            ("qkv", layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj)),
            ("gate_up", pre_mlp, (mlp.gate_proj, mlp.up_proj)),
        ):
            columns = torch.stack([m.weight.float().abs().amax(dim=0) for m in consumers]).amax(dim=0)
            s = factors(ranges[(i, role)], columns, alpha)
            for module in consumers:
                _scale_columns(module, s)
            _divide_norm(norm, s)
        # o_proj: one factor per (kv head, dim), shared by the query heads reading that v.
        head_dim = attn.o_proj.weight.shape[1] // num_heads
        grouped = (num_kv, num_heads // num_kv, head_dim)
        act = ranges[(i, "o_proj")].reshape(grouped).amax(dim=1)
        cols = attn.o_proj.weight.float().abs().amax(dim=0).reshape(grouped).amax(dim=1)
        s = factors(act, cols, alpha)  # [KV, D]
        _scale_columns(attn.o_proj, s[:, None, :].expand(grouped).reshape(-1))
        _divide_rows(attn.v_proj, s.reshape(-1))
        # down: its input is act(gate) * up, linear in up.
        s = factors(ranges[(i, "down")], mlp.down_proj.weight.float().abs().amax(dim=0), alpha)
        _scale_columns(mlp.down_proj, s)
        _divide_rows(mlp.up_proj, s)


# float32 weights in place. They are mapped from the safetensors file, so each page written is copied on a
# fault; the copies go with the mapping once the engine has built its own weights (model.py `_own_copy`).
# New tensors instead were slower to load and left the worker larger (2026-12-06, AVX2 EPYC, a worker's load
# 5.9-7.2 s against 5.4-6.0 in place, resident 2257 against 2014 MB; docs/STUDY_LOG.md).
def _scale_columns(module: torch.nn.Linear, s: torch.Tensor) -> None:
    if module.weight.dtype == torch.float32:
        module.weight.mul_(s[None, :])
    else:
        module.weight.copy_((module.weight.float() * s[None, :]).to(module.weight.dtype))


def _divide_rows(module: torch.nn.Linear, s: torch.Tensor) -> None:
    if module.weight.dtype == torch.float32:
        module.weight.div_(s[:, None])
    else:
        module.weight.copy_((module.weight.float() / s[:, None]).to(module.weight.dtype))
    if module.bias is not None:
        module.bias.copy_((module.bias.float() / s).to(module.bias.dtype))


def _divide_norm(norm: torch.nn.Module, s: torch.Tensor) -> None:
    """Divide the norm's multiplier by s (its weight, or 1 + weight for Gemma's)."""
    offset = 1.0 if type(norm).__name__ in UNIT_OFFSET_NORMS else 0.0
    multiplier = (norm.weight.float() + offset) / s
    norm.weight.copy_((multiplier - offset).to(norm.weight.dtype))
