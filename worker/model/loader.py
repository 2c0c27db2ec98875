"""Load a Hugging Face model directory (config, tokenizer, chat template, weights) of a supported family."""

from __future__ import annotations

import logging
import os

import torch

from worker.model.cpu_kind import auto_choice, cpu_info
from worker.model.model import LlamaForPagedAttention
from worker.model.quant import native_cpu_bfloat16
from worker.model.smoothing import CALIBRATION_TEXT, smooth
from worker.model.w4a8 import w4a8_available
from worker.model.w8a8 import w8a8_available

log = logging.getLogger(__name__)

# Decoder-only families whose weights worker/model/model.py gathers (RMSNorm, rotary, GQA, gated MLP). Llama,
# Mistral and Qwen2 run on the Llama forward pass; Gemma 3 (text) also needs what
# FORWARD_FEATURES in worker/model/model.py lists, and is refused with the list of what is missing until then.
SUPPORTED_MODEL_TYPES = {"llama", "mistral", "qwen2", "gemma3_text"}


class UnsupportedModelError(ValueError):
    """The model directory holds an architecture this engine cannot run (raised before serving starts)."""


def check_model_type(path: str) -> str:
    """The directory's model type, or UnsupportedModelError naming it and what is supported."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or "no architectures listed"
        raise UnsupportedModelError(
            f"{path}: model type {model_type!r} ({architectures}) is not supported by this engine; "
            f"supported model types: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )
    return model_type


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_dtype(name: str, device: str, quantization: str = "none", kind: str | None = None) -> str:
    """`auto`: on CUDA bfloat16 (float16 without bf16 support); on CPU with weight-only quantized weights
    float32 (the native kernels read float32 rows and the fused decode step is the float32 layer: a bfloat16
    model around them measured slower at every batch size); else (w8a8 and w4a8 included: their rows are
    quantized to 8 bits whatever their dtype) what worker/model/cpu_kind.py's table picks for this CPU's kind
    (bfloat16 where it is native: AVX512-BF16, AMX; float32 where it is emulated). w4a8 in bfloat16 on an
    AVX512-BF16 EPYC: decode steps 0.83-0.89x float32's time from 8 sequences, perplexity within 0.1%."""
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if quantization in ("int8", "int4"):
        return "float32"
    chosen = auto_choice(kind or cpu_info().kind).dtype
    return chosen or ("bfloat16" if native_cpu_bfloat16() else "float32")


def resolve_quantization(
    name: str, device: str, kind: str | None = None, model_path: str | None = None
) -> str:
    """`auto`: what cpu_kind.py's table picks for this CPU's kind: the row with the most tokens/s under
    concurrent load where the kind was measured (w4a8 on AVX2, bfloat16 weights on AVX512-BF16 and AMX), a
    safe default where not. w4a8 computes a GGUF file's own 4-bit blocks: for a model without them
    (`model_path` has no such file) `auto` takes w8a8 instead, since quantizing float weights to 4 bits
    was not what was measured. int8, w8a8 and w4a8 need the compiled kernels (`make kernels`); without them,
    none. GPUs serve the unquantized weights."""
    if name != "auto":
        return name
    chosen = auto_choice(kind or cpu_info().kind).quantization
    if device.startswith("cuda") or chosen == "none":
        return "none"
    if chosen == "w4a8":
        if w4a8_available(torch.device(device)) and has_4bit_blocks(model_path):
            return "w4a8"
        chosen = "w8a8"
    if chosen == "w8a8":
        return "w8a8" if w8a8_available(torch.device(device)) else "none"
    from worker.kernels import native_ops

    ops = native_ops()
    return "int8" if ops is not None and hasattr(ops, "int8_linear") else "none"


def has_4bit_blocks(model_path: str | None) -> bool:
    """Whether the model directory keeps a GGUF file whose layer weights are all Q4_0/Q4_1 blocks (the
    weights int4 and w4a8 then compute as they are; its tensor directory only is read)."""
    from worker.model.gguf import find_gguf, read_gguf_tensors

    gguf_path = find_gguf(model_path) if model_path and os.path.isdir(model_path) else None
    if gguf_path is None:
        return False
    tensors = read_gguf_tensors(gguf_path).items()
    layers = [t for name, t in tensors if name.startswith("blk.") and len(t.shape) == 2]  # not the norms
    return bool(layers) and all(t.kind != "other" for t in layers)


def resolve_precision(
    dtype: str, quantization: str, device: str, model_path: str | None = None
) -> tuple[str, str]:
    """Both settings resolved, logged with the CPU and the reason `auto` chose them (the choice is also
    exported: the quantization and cpu_info metrics, and GetModelInfo's dtype)."""
    resolved_quantization = resolve_quantization(quantization, device, model_path=model_path)
    resolved_dtype = resolve_dtype(dtype, device, resolved_quantization)
    cpu = cpu_info()
    why = "" if device.startswith("cuda") else f": {auto_choice(cpu.kind).basis}"
    log.info(
        "dtype %s (WORKER_DTYPE=%s), quantization %s (WORKER_QUANTIZATION=%s) on %s; CPU %s%s",
        resolved_dtype,
        dtype,
        resolved_quantization,
        quantization,
        device,
        cpu.describe(),
        why if "auto" in (dtype, quantization) else "",
    )
    return resolved_dtype, resolved_quantization


def load_tokenizer(path: str):  # a transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_hf_model(path: str, dtype: str, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    check_model_type(path)
    # No `Loading weights` bar: the worker's output is its log (JSON lines with LOG_FORMAT=json).
    transformers_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    return model.to(device).eval()


def load_model(
    path: str,
    dtype: str,
    device: str,
    max_positions: int,
    linear_backend: str = "auto",
    quantization: str = "none",
) -> LlamaForPagedAttention:
    hf_model = load_hf_model(path, dtype, device)
    if quantization == "w8a8":  # move the activations' outliers into the weights first (model/smoothing.py)
        model_dir = path if os.path.isdir(path) else None
        smooth(hf_model, load_tokenizer(path).encode(CALIBRATION_TEXT.read_text()), model_dir=model_dir)
    int4_groups = gguf_int4_groups(path, hf_model) if quantization in ("int4", "w4a8") else {}
    model = LlamaForPagedAttention(hf_model, max_positions, linear_backend, quantization, int4_groups)
    missing = model.missing_forward_features()
    if missing:
        raise UnsupportedModelError(
            f"{path}: model type {hf_model.config.model_type!r} needs what this engine's forward pass does "
            f"not compute yet: {', '.join(missing)} (FORWARD_FEATURES in worker/model/model.py)"
        )
    log.info(
        "loaded %s (%s, %s, %s linear layers, quantization %s)",
        path,
        dtype,
        device,
        model.linear_backend,
        quantization,
    )
    return model


def gguf_int4_groups(path: str, hf_model: torch.nn.Module) -> dict:
    """4-bit blocks from the GGUF file kept in the model directory, where there is one (else {}:
    every weight is quantized from float at load)."""
    from worker.model.gguf import find_gguf, load_int4_groups

    gguf_path = find_gguf(path) if os.path.isdir(path) else None
    if gguf_path is None:
        return {}
    config = hf_model.config
    weights = {n: p for n, p in hf_model.named_parameters() if n.startswith("model.layers.") and p.dim() == 2}
    groups = load_int4_groups(gguf_path, weights, config.num_attention_heads, config.num_key_value_heads)
    log.info(
        "int4: %d of %d layer weights loaded from %s's 4-bit blocks", len(groups), len(weights), gguf_path
    )
    return groups
