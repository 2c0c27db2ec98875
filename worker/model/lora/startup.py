"""Turn LoRA serving on for a freshly built engine: refuse what it cannot run, wrap the projections, load
WORKER_LORA_MODULES."""

from __future__ import annotations

from worker.model.lora.manager import LoraManager, base_model_spec


def start_lora(config, model, runner, device: str) -> LoraManager:
    """`config`: EngineConfig with lora enabled; raises ValueError with the reason where it cannot run."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config.model)
    intermediate = getattr(hf_config, "intermediate_size", None)
    if intermediate is None:
        raise ValueError(f"{config.model}: no intermediate_size in its config; LoRA cannot size the MLP")
    base = base_model_spec(config.model, model, intermediate)
    manager = LoraManager(config.lora, base, model.embed.dtype, model.embed.device)
    runner.use_lora(manager)  # refuses CUDA decode graphs
    manager.load_startup_modules()
    return manager
