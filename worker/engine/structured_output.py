"""Constrained decoding with llguidance: a grammar per request, its token mask applied in the sampler.

Why llguidance: no dependencies (xgrammar declares torch, transformers and triton), schemas compile
fastest of the three measured, and its per-token cost is small beside a model step (docs/BENCHMARKS.md,
grammar libraries). It also reads regexes and Lark grammars, and rolls back.

Flow: `GrammarCache.matcher(spec)` (any thread, at admission) compiles a spec once, keeps the fresh
matcher, and hands each request its own copy. Each step the sampler asks every constrained row for its
bitmask (`fill_bitmask`) and masks the logits; the engine then feeds each accepted token to `accept`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict

from worker.engine.sampling_params import GrammarSpec

log = logging.getLogger(__name__)

# Compact JSON: a small model left free to choose whitespace tends to emit newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A spec that does not compile: the caller's input problem."""


def grammar_text(spec: GrammarSpec) -> str:
    """The spec in llguidance's grammar format (schema compile options included)."""
    import llguidance

    compile_from = llguidance.LLMatcher
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.value)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError("the JSON schema must be an object")
        return compile_from.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if spec.kind == "json_object":
        return compile_from.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if spec.kind == "regex":
        return compile_from.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        alternatives = " | ".join(json.dumps(choice) for choice in json.loads(spec.value))
        return compile_from.grammar_from_lark(f"start: {alternatives}")
    if spec.kind == "grammar":
        return compile_from.grammar_from_lark(spec.value)
    raise GrammarError(f"unknown structured output kind {spec.kind!r}")


class Grammar:
    """One request's matcher: which tokens may come next, advanced by each accepted token."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into row `row` of a C-contiguous int32 numpy array."""
        target = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)

    def accept(self, token_id: int) -> bool:
        accepted = self.matcher.consume_token(token_id)
        if not accepted:
            log.warning("grammar refused token %d: %s", token_id, self.matcher.get_error())
        return accepted

    def accept_drafts(self, token_ids: list[int]) -> int:
        """How many leading draft tokens the grammar allows; the matcher is left where it was."""
        num = self.matcher.try_consume_tokens(token_ids)
        if num:
            self.matcher.rollback(num)
        return num

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()


class GrammarCache:
    """Compiled grammars by spec (least recently used out), and the tokenizer llguidance needs.

    Building llguidance's view of the vocabulary takes seconds, so `prefetch()` starts it on a thread at
    start-up; the first constrained request waits for it only if it comes sooner.
    """

    def __init__(self, hf_tokenizer, eos_token_ids: list[int], vocab_size: int, capacity: int = 256) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.capacity = capacity
        self._lock = threading.Lock()
        self._ll_tokenizer = None
        self._ready = threading.Event()
        self._matchers: OrderedDict[GrammarSpec, object] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def prefetch(self) -> None:
        threading.Thread(target=self._tokenizer, name="grammar-tokenizer", daemon=True).start()

    def _tokenizer(self):
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self._eos_token_ids or None
                )
            return self._ll_tokenizer

    def matcher(self, spec: GrammarSpec) -> Grammar:
        """A fresh matcher for this spec; raises GrammarError when the spec does not compile."""
        tokenizer = self._tokenizer()
        with self._lock:
            template = self._matchers.get(spec)
            if template is not None:
                self._matchers.move_to_end(spec)
                self.hits += 1
                return Grammar(template.deep_copy())
        import llguidance

        grammar = grammar_text(spec)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise GrammarError(f"invalid {spec.kind.replace('_', ' ')}: {error}")
        template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if template.is_error():
            raise GrammarError(f"invalid {spec.kind.replace('_', ' ')}: {template.get_error()}")
        with self._lock:
            self.misses += 1
            self._matchers[spec] = template
            while len(self._matchers) > self.capacity:
                self._matchers.popitem(last=False)
        return Grammar(template.deep_copy())
