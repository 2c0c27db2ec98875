"""Small PEFT LoRA adapters for tests: no adapter ships in a package, so tests make them. B starts random
(init_lora_weights=False), so each adapter changes the model's output."""

from __future__ import annotations

import json
import os

import torch

MODEL_DIR = "models/SmolLM2-135M-Instruct"
ATTENTION_AND_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_base(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=dtype).eval()


def make_adapter(
    out_dir: str,
    seed: int,
    target_modules: list[str] | None = None,
    r: int = 8,
    lora_alpha: int = 16,
    base: torch.nn.Module | None = None,
    **config: object,
) -> str:
    """Save a random LoRA adapter for the bundled model in `out_dir`; returns the directory."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    lora = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=target_modules or ATTENTION_AND_MLP,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
        **config,
    )
    model = get_peft_model(base if base is not None else load_base(), lora)
    with torch.no_grad():  # small B, so the output stays language-like but clearly moves
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.5)
    model.save_pretrained(out_dir)
    model.unload()  # leaves `base` as it was, for the next adapter
    return out_dir


def edit_config(adapter_dir: str, **changes: object) -> None:
    path = os.path.join(adapter_dir, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)


def peft_greedy(adapter_dir: str | None, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers + peft's greedy continuation with that adapter (None: the base model)."""
    model = load_base()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()
