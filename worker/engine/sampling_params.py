"""Per-request sampling and stopping parameters (OpenAI's, plus vLLM's extensions): the engine's typed
form of the sampling contract (common/sampling.py), whose defaults and ranges these are."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from common import sampling
from common.sampling import GRAMMAR_KINDS

_D = sampling.DEFAULTS


@dataclass(frozen=True)
class GrammarSpec:
    """What to constrain the output to; hashable, so compiled grammars are cached by it."""

    kind: str  # one of GRAMMAR_KINDS
    value: str  # a JSON schema text, a regex, a Lark grammar, or a JSON list of choices; "" for json_object


@dataclass
class SamplingParams:
    """The contract's fields, with its defaults."""

    n: int = _D["n"]
    temperature: float = _D["temperature"]
    top_p: float = _D["top_p"]
    top_k: int = _D["top_k"]  # -1 or 0: off
    min_p: float = _D["min_p"]
    seed: int | None = _D["seed"]
    presence_penalty: float = _D["presence_penalty"]
    frequency_penalty: float = _D["frequency_penalty"]
    repetition_penalty: float = _D["repetition_penalty"]
    max_tokens: int | None = _D["max_tokens"]  # None: up to the context limit
    min_tokens: int = _D["min_tokens"]
    ignore_eos: bool = _D["ignore_eos"]
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = _D["logprobs"]  # None: no logprobs; k: sampled token's logprob and the top k
    skip_special_tokens: bool = _D["skip_special_tokens"]
    include_stop_str_in_output: bool = _D["include_stop_str_in_output"]
    structured_output: GrammarSpec | None = None  # None: free text
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    prompt_logprobs: int | None = _D["prompt_logprobs"]  # None: none; k: each prompt token's, rank and top k
    allowed_token_ids: list[int] = field(default_factory=list)  # set: the only tokens that may be sampled
    bad_words: list[str] = field(default_factory=list)  # words never generated (Request.bad_word_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    def validate(self) -> None:
        """Raise common.sampling.SamplingError (a ValueError naming the field) for out-of-range values."""
        values = {name: value for name, value in asdict(self).items() if name != "structured_output"}
        sampling.check(values)
        if self.structured_output is not None and self.structured_output.kind not in GRAMMAR_KINDS:
            raise sampling.SamplingError("unknown structured output kind", "structured_output")
