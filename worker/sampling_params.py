"""Per-request sampling and stopping parameters (OpenAI's, plus vLLM's extensions)."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20
MAX_N = 128  # choices per request: each one is a sequence of its own in the engine
MAX_LOGIT_BIAS = 100.0
# Each stop string is matched against the text after every token: a worker bound for direct gRPC clients
# (the gateway's own limits, GATEWAY_MAX_STOP and GATEWAY_MAX_STOP_CHARS, are tighter).
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class GrammarSpec:
    """What to constrain the output to; hashable, so compiled grammars are cached by it."""

    kind: str  # one of GRAMMAR_KINDS
    value: str  # a JSON schema text, a regex, a Lark grammar, or a JSON list of choices; "" for json_object


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None  # None: up to the context limit
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None  # None: no logprobs; k: sampled token's logprob and the top k
    skip_special_tokens: bool = True
    structured_output: GrammarSpec | None = None  # None: free text
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's logprob, its rank and the top k

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    def validate(self) -> None:
        """Raise ValueError with a user-facing message for out-of-range values."""
        checks = [
            (1 <= self.n <= MAX_N, f"n must be between 1 and {MAX_N}"),
            (self.temperature >= 0.0, "temperature must be non-negative"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be 0 (off) or positive"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]"),
            (self.repetition_penalty > 0.0, "repetition_penalty must be positive"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.min_tokens >= 0, "min_tokens must be non-negative"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                "min_tokens must not exceed max_tokens",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS,
                f"prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
            ),
            (all(s for s in self.stop), "stop strings must not be empty"),
            (len(self.stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings are allowed"),
            (
                all(len(s) <= MAX_STOP_CHARS for s in self.stop),
                f"each stop string may have at most {MAX_STOP_CHARS} characters",
            ),
            (
                len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
                f"at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed",
            ),
            (
                all(-MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for b in self.logit_bias.values()),
                f"logit_bias values must be between -{MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g}",
            ),
            (
                self.structured_output is None or self.structured_output.kind in GRAMMAR_KINDS,
                "unknown structured output kind",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
