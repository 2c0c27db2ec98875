"""Load a Hugging Face Llama-family directory (config, tokenizer, chat template, weights)."""

from __future__ import annotations

import logging

import torch

from worker.model import LlamaForPagedAttention

log = logging.getLogger(__name__)

# Decoder-only models with the Llama layer layout (RMSNorm, rotary, GQA, SwiGLU).
SUPPORTED_MODEL_TYPES = {"llama", "mistral", "qwen2"}


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_tokenizer(path: str):  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_hf_model(path: str, dtype: str, device: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model type {config.model_type!r} is not supported; "
            f"expected one of {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    return model.to(device).eval()


def load_model(
    path: str, dtype: str, device: str, max_positions: int, linear_backend: str = "auto"
) -> LlamaForPagedAttention:
    hf_model = load_hf_model(path, dtype, device)
    model = LlamaForPagedAttention(hf_model, max_positions, linear_backend)
    log.info("loaded %s (%s, %s, %s linear layers)", path, dtype, device, model.linear_backend)
    return model
