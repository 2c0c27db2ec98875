"""Prompt-lookup (n-gram) speculation for greedy single streams.

One decode step of a small model on a CPU is bound by reading the weights, not by arithmetic: it
costs about the same to run 1 token as 5. So for a greedy request the scheduler may append a few
draft tokens, guessed by finding the most recent earlier occurrence of the sequence's last n tokens
and copying what followed it. The model scores all of them in one pass; the longest prefix of the
drafts that matches its own argmax is kept, plus the model's next token after it. The output is
exactly the greedy output, only produced in fewer passes. Drafts are rejected for free when wrong.
"""

from __future__ import annotations

from worker.engine.request import Request


def propose_ngram_drafts(
    tokens: list[int], num_drafts: int, max_ngram: int = 3, min_ngram: int = 1
) -> list[int]:
    """Up to num_drafts tokens that followed the latest earlier match of the last n tokens."""
    if num_drafts <= 0:
        return []
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                follow = tokens[start + n : start + n + num_drafts]
                if follow:
                    return follow
    return []


def can_speculate(request: Request) -> bool:
    """Only plain greedy requests: their accepted tokens provably equal one-at-a-time decoding."""
    p = request.params
    return (
        p.greedy
        and p.logprobs is None
        and not p.presence_penalty
        and not p.frequency_penalty
        and p.repetition_penalty == 1.0
        and request.num_output_tokens >= p.min_tokens
        and request.grammar is None  # drafts would be verified against unmasked logits
        and not p.logit_bias
        and not p.allowed_token_ids
        and not p.bad_words
    )


def num_accepted(drafts: list[int], targets: list[int]) -> int:
    """How many leading drafts equal the model's own choices at their positions."""
    accepted = 0
    for draft, target in zip(drafts, targets, strict=False):
        if draft != target:
            break
        accepted += 1
    return accepted
