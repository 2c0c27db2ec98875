"""A sequence in the engine: its tokens, how many have KV in the cache, its blocks, its status."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from worker.engine.lora_registry import LoraRef
from worker.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """The one place that maps a terminal status to an OpenAI finish reason."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass
class Request:
    """One sequence (one choice). n > 1 becomes n Requests sharing a group id and the prompt's blocks.

    Tokens [0, num_computed_tokens) have K/V in the cache; the rest still have to run. After the
    last prompt token runs, each step samples one token and appends it, so during decode exactly one
    token is pending.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None = None
    max_tokens: int = 16  # resolved (never None) by the engine
    group_id: str = ""
    index: int = 0  # choice index within the group
    grammar: Any = field(default=None, repr=False)  # structured_output.Grammar when the output is constrained
    arrival_time: float = field(default_factory=time.monotonic)
    lora: LoraRef | None = None  # the LoRA adapter it runs with; None: the base model
    bad_word_ids: list[list[int]] = field(default_factory=list)  # params.bad_words as token sequences

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prompt tokens found in the prefix cache at first admission; -1: not yet
    block_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    num_prefix_waits: int = 0  # steps it waited for another request's prefill of its leading blocks
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    # Prompt logprobs computed so far, for positions 1, 2, ...: (logprob, rank, top ids, top logprobs).
    prompt_logprobs: list[tuple[float, int, list[int], list[float]]] = field(default_factory=list, repr=False)
    prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        self.group_id = self.group_id or self.request_id
        self.all_token_ids: list[int] = list(self.prompt_token_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Still to compute (and send) its prompt logprobs: its prompt must run, not come from the cache."""
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_sent

    @property
    def lora_id(self) -> int:
        return self.lora.lora_id if self.lora is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
