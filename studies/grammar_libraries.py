"""Which grammar library to constrain decoding with: xgrammar, llguidance and outlines-core side by side on
this machine, with the served model's tokenizer (vocab 49152).

For each library: the one-off tokenizer setup, the compile time of a JSON schema (fresh, no cache), and the
per-token cost of what the engine does each step (compute the next-token bitmask, then advance the matcher
by the accepted token) while walking the tokens of a valid document. Medians over rounds, one process.

    .venv/bin/python -m studies.grammar_libraries [--rounds 5] [--write-docs]

xgrammar and outlines-core are not runtime dependencies: install them by hand to run this
(`pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 outlines-core==0.2.14`); a library that
is absent is reported as such.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
from transformers import AutoTokenizer

from bench.report import median, publish

MODEL_DIR = "models/SmolLM2-135M-Instruct"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "role": {"enum": ["admin", "editor", "viewer"]},
    },
    "required": ["name", "age", "email", "tags", "address", "role"],
    "additionalProperties": False,
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["math", "engines", "poetry of science"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"},
    "role": "editor",
}


def variant(i: int) -> dict:
    """A schema that differs per round, so no library can answer the compile from a cache."""
    schema = json.loads(json.dumps(SCHEMA))
    schema["properties"][f"extra_{i}"] = {"type": "string"}
    return schema


class Library:
    name: str

    def setup(self, tokenizer) -> None: ...
    def compile(self, schema: dict) -> object: ...
    def walk(self, compiled: object, tokens: list[int]) -> list[float]: ...


class LLGuidance(Library):
    name = "llguidance 1.9.1"

    def setup(self, tokenizer) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll, self.llt = llguidance, llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, self.tokenizer.vocab_size)

    def compile(self, schema: dict) -> object:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            json.dumps(schema),
            defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        )
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        self.llt.fill_next_token_bitmask(matcher, self.bitmask, 0)  # the first mask is part of the set-up
        return matcher

    def walk(self, compiled: object, tokens: list[int]) -> list[float]:
        times = []
        for token in tokens:
            start = time.perf_counter()
            self.llt.fill_next_token_bitmask(compiled, self.bitmask, 0)
            assert compiled.consume_token(token), compiled.get_error()
            times.append(time.perf_counter() - start)
        return times


class XGrammar(Library):
    name = "xgrammar 0.2.8"

    def setup(self, tokenizer) -> None:
        import xgrammar

        self.xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
        self.compiler = xgrammar.GrammarCompiler(self.info, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, self.info.vocab_size)

    def compile(self, schema: dict) -> object:
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
        )
        return self.xgr.GrammarMatcher(compiled)

    def walk(self, compiled: object, tokens: list[int]) -> list[float]:
        times = []
        for token in tokens:
            start = time.perf_counter()
            compiled.fill_next_token_bitmask(self.bitmask, 0)
            assert compiled.accept_token(token)
            times.append(time.perf_counter() - start)
        return times


class OutlinesCore(Library):
    name = "outlines-core 0.2.14"

    def setup(self, tokenizer) -> None:
        import outlines_core

        self.oc = outlines_core
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        special = set(tokenizer.all_special_ids)
        vocab: dict[bytes, list[int]] = {}
        for token, token_id in tokenizer.get_vocab().items():
            if token_id not in special:  # byte-level BPE: each character stands for one byte
                vocab.setdefault(bytes(byte_of[c] for c in token), []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(tokenizer.eos_token_id, vocab)
        self.mask = torch.zeros((len(tokenizer) + 31) // 32, dtype=torch.int32)

    def compile(self, schema: dict) -> object:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def walk(self, compiled: object, tokens: list[int]) -> list[float]:
        times = []
        for token in tokens:
            start = time.perf_counter()
            compiled.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())
            compiled.advance(token)
            times.append(time.perf_counter() - start)
        return times


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def measure(library: Library, tokenizer, tokens: list[int], rounds: int) -> dict[str, float]:
    setup_s, _ = timed(lambda: library.setup(tokenizer))
    compiles, per_token = [], []
    for i in range(rounds):
        schema = variant(i)
        compile_s, compiled = timed(lambda schema=schema: library.compile(schema))
        compiles.append(compile_s)
        per_token.append(median(library.walk(compiled, tokens)))
    return {
        "setup_ms": setup_s * 1e3,
        "compile_ms": median(compiles) * 1e3,
        "token_us": median(per_token) * 1e6,
    }


def apply_cost(vocab: int, rows: int, repeats: int = 50) -> float:
    """Microseconds to mask `rows` rows of logits with the worker's numpy path (half the tokens allowed)."""
    from worker.model.sampler import allocate_bitmask, apply_bitmask

    logits = torch.randn(rows, vocab)
    bitmask = allocate_bitmask(rows, vocab)
    bitmask[:, ::2] = 0x0F0F0F0F
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        apply_bitmask(logits, bitmask)
        times.append(time.perf_counter() - start)
    return median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    document = json.dumps(DOCUMENT)
    tokens = tokenizer.encode(document, add_special_tokens=False)
    rows = []
    for library in (XGrammar(), LLGuidance(), OutlinesCore()):
        try:
            figures = measure(library, tokenizer, tokens, args.rounds)
        except ImportError as exc:
            rows.append(f"| {library.name} | not installed ({exc.name}) | | |")
            continue
        print(library.name, {k: round(v, 2) for k, v in figures.items()}, flush=True)
        rows.append(
            f"| {library.name} | {figures['setup_ms']:.0f} | {figures['compile_ms']:.1f}"
            f" | {figures['token_us']:.0f} |"
        )
    vocab = len(tokenizer)
    apply_1, apply_32 = apply_cost(vocab, 1), apply_cost(vocab, 32)
    print(f"apply bitmask: 1 row {apply_1:.0f} us, 32 rows {apply_32:.0f} us")
    command = f".venv/bin/python -m studies.grammar_libraries --rounds {args.rounds} --write-docs"
    publish(
        "grammar-libraries",
        [
            "## Grammar libraries for constrained decoding",
            "",
            f"`{command}`: one thread, the served model's tokenizer (vocab {vocab}), a 6-field JSON schema",
            "with a nested object, an array and an enum, a fresh schema each round (no cache); per token =",
            "compute the next-token mask + advance the matcher, median over the",
            f"{len(tokens)} tokens of a valid document; medians over {args.rounds} rounds.",
            "",
            "| library | tokenizer setup (ms, once) | schema compile (ms) | per token (us) |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            f"Masking the logits with the bitmask (worker/model/sampler.py, numpy): {apply_1:.0f} us"
            " for 1 row,"
            f" {apply_32:.0f} us for 32 rows.",
        ],
        args.write_docs,
    )


if __name__ == "__main__":
    main()
