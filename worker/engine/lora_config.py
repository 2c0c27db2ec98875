"""LoRA settings, with vLLM's meaning (numbers and strings only: the scheduler builds without a model)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoraConfig:
    enabled: bool = False  # WORKER_ENABLE_LORA; implied by lora_modules
    lora_modules: str = ""  # WORKER_LORA_MODULES: "name=path,name2=path2", loaded at start
    max_loras: int = 1  # WORKER_MAX_LORAS: distinct adapters in one batch
    max_cpu_loras: int | None = None  # WORKER_MAX_CPU_LORAS: adapters held in memory (LRU); None: max_loras
    max_lora_rank: int = 16  # WORKER_MAX_LORA_RANK

    def __post_init__(self) -> None:
        self.enabled = self.enabled or bool(self.lora_modules.strip())
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank must be positive")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras}): every "
                "adapter of a batch has to be in memory"
            )
        self.modules()  # refuses a malformed list at start

    def modules(self) -> dict[str, str]:
        """WORKER_LORA_MODULES as {name: path}, in order."""
        out: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in self.lora_modules.split(","))):
            name, sep, path = item.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"WORKER_LORA_MODULES: expected name=path, got {item!r}")
            if name.strip() in out:
                raise ValueError(f"WORKER_LORA_MODULES: adapter name {name.strip()!r} appears twice")
            out[name.strip()] = path.strip()
        return out
