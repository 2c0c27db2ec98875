"""Multi-LoRA serving: PEFT adapters on the base model, many in one batch (punica/S-LoRA style: the base
weights are never merged; each projection adds its low-rank products grouped by adapter)."""
