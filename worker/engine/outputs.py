"""What the engine streams back to its callers, one object per choice and step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    token_bytes: bytes = b""
    rank: int = 0  # prompt logprobs: 1 + how many tokens were more likely; 0: not computed


@dataclass
class PositionLogprobs:
    chosen: TokenLogprob
    top: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass
class RequestOutput:
    """A delta of one choice (`index`) of a request (`group_id`: the id the request came in with, shared by
    its n choices). The final one has finish_reason and usage set."""

    group_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    usage: Usage | None = None
    # Every prompt position (position 0: its token only, rank 0), on the first output of a choice that
    # asked for them.
    prompt_logprobs: list[PositionLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class PromptInput:
    """Exactly one of the three forms."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None  # role, content; tool_calls, tool_call_id, name when set
    token_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI tool definitions, rendered with the messages
    add_generation_prompt: bool = True  # chat: open the assistant's turn after the messages
    continue_final_message: bool = False  # chat: leave the last (assistant) message open instead
    truncate_prompt_tokens: int | None = None  # k > 0: the last k tokens only; -1: the last max_model_len
    template_kwargs: dict[str, Any] | None = None  # chat: more variables for the template (vLLM's)
    documents: list[Any] | None = None  # chat: the template's `documents` (vLLM's)


@dataclass
class ModelInfo:
    model_name: str
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    dtype: str
    device: str
    max_num_seqs: int
    vocab_size: int
    quantization: str = "none"


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    num_kv_blocks_used: int = 0
    num_kv_blocks_total: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_finished: int = 0

    @property
    def kv_cache_usage(self) -> float:
        return self.num_kv_blocks_used / self.num_kv_blocks_total if self.num_kv_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


@dataclass
class StepStats:
    """One engine step, for metrics."""

    num_running: int
    num_waiting: int
    num_kv_blocks_used: int
    num_kv_blocks_total: int
    batch_size: int  # sequences in the step
    num_batched_tokens: int
    step_time_s: float
    num_preemptions: int
    prefix_cache_queries: int  # tokens new requests looked up this step (not preempted ones resuming)
    prefix_cache_hits: int
    num_prompt_tokens: int  # prompt tokens computed this step
    num_generation_tokens: int  # tokens sampled this step
    num_kv_block_copies: int = 0  # cached blocks moved so that a sequence's blocks lie side by side
    time_to_first_tokens_s: list[float] = field(default_factory=list)
    inter_token_latencies_s: list[float] = field(default_factory=list)
    running_lora_adapters: tuple[str, ...] = ()  # the adapters of the running requests, sorted
    waiting_lora_adapters: tuple[str, ...] = ()  # and of the waiting ones
    num_lora_loads: int = 0  # adapters read from disk since the last step (reloads after eviction too)


@dataclass
class FinishedRequestStats:
    """One finished choice, for metrics."""

    finish_reason: str
    prompt_tokens: int
    generation_tokens: int
    cached_tokens: int
    queue_time_s: float  # arrival to first scheduled
    e2e_latency_s: float  # arrival to finish
