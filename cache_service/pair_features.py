"""What the learned verifier sees of two questions: how well every word piece of one finds its counterpart
in the other, not just how close the two sentence vectors are.

A sentence vector averages a question away: "capital of France" and "capital of Germany" differ in one
piece out of six. So besides the cosine, each piece is matched to its best partner on the other side, by
its contextual vector (the model's last layer) and by its static input vector (the word itself), and the
worst matches, the pieces with no exact partner, and how much the shared pieces are reordered become the
features. The verifier (cache_service/verifier.py) is a classifier fitted on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache_service.pair_checks import CHECK_NAMES, check_flags, words
from cache_service.related_words import RELATED_NAMES, one_sided_words, related_counts
from cache_service.word_frequency import RARITY_NAMES, rarity

TOKEN_FEATURE_NAMES = (
    "cosine",
    "context_worst_min",  # the worse side's worst-matched piece, contextual vectors
    "context_worst_max",  # the better side's
    "context_mean",
    "static_worst_min",  # the same with static (input) vectors
    "static_worst_max",
    "static_mean",
    "static_poor_min",  # pieces whose best static match is under POOR_MATCH, fewer side
    "static_poor_max",  # more side
    "length_gap",  # |len a - len b| / max
    "unshared_min",  # pieces with no identical piece on the other side, fewer side
    "unshared_max",
    "unshared_best_static",  # the lowest best-static-match among those unshared pieces
    "order_inversions",  # share of pairs of shared pieces that appear in the other order
)
TEXT_FEATURE_NAMES = CHECK_NAMES + RELATED_NAMES + RARITY_NAMES
FEATURE_NAMES = TOKEN_FEATURE_NAMES + TEXT_FEATURE_NAMES
POOR_MATCH = 0.6


@dataclass(frozen=True)
class TokenStates:
    """One text as the verifier needs it: its sentence vector and, per word piece (specials and punctuation
    dropped), the piece id, its L2-normalized contextual vector and its L2-normalized static vector."""

    sentence: np.ndarray  # (dim,)
    ids: tuple[int, ...]
    context: np.ndarray  # (pieces, dim)
    static: np.ndarray  # (pieces, dim)


def _best_matches(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(x) == 0 or len(y) == 0:
        return np.zeros(len(x), np.float32), np.zeros(len(y), np.float32)
    sims = x @ y.T
    return sims.max(axis=1), sims.max(axis=0)


def _inversions(a_ids: tuple[int, ...], b_ids: tuple[int, ...]) -> float:
    """Kendall-style disorder of the pieces both sides share (each id at its first place in b)."""
    first_in_b: dict[int, int] = {}
    for pos, piece in enumerate(b_ids):
        first_in_b.setdefault(piece, pos)
    seq = [first_in_b[p] for p in a_ids if p in first_in_b]
    n = len(seq)
    if n < 2:
        return 0.0
    inverted = sum(1 for i in range(n) for j in range(i + 1, n) if seq[i] > seq[j])
    return inverted / (n * (n - 1) / 2)


def text_features(a: str, b: str) -> tuple[float, ...]:
    """The TEXT_FEATURE_NAMES of two texts: the cheap checks' objections, the words WordNet relates and how
    rare the words are that only one side has."""
    only_a, only_b, shared = one_sided_words(words(a), words(b))
    return (
        *(float(flag) for flag in check_flags(a, b)),
        *related_counts(only_a, only_b),
        *rarity(only_a, only_b, shared),
    )


def pair_features(a: TokenStates, b: TokenStates, texts: Sequence[float]) -> np.ndarray:
    """The FEATURE_NAMES of one pair, symmetric in a and b except for the order feature and the related-word
    count; `texts`: the two texts' text_features."""
    ca, cb = _best_matches(a.context, b.context)
    sa, sb = _best_matches(a.static, b.static)
    worst_c = sorted((float(ca.min(initial=1.0)), float(cb.min(initial=1.0))))
    worst_s = sorted((float(sa.min(initial=1.0)), float(sb.min(initial=1.0))))
    poor = sorted((int((sa < POOR_MATCH).sum()), int((sb < POOR_MATCH).sum())))
    shared_b, shared_a = set(b.ids), set(a.ids)
    unshared_a = [k for k, p in enumerate(a.ids) if p not in shared_b]
    unshared_b = [k for k, p in enumerate(b.ids) if p not in shared_a]
    unshared = sorted((len(unshared_a), len(unshared_b)))
    unshared_best = min([float(sa[k]) for k in unshared_a] + [float(sb[k]) for k in unshared_b] + [1.0])
    longest = max(len(a.ids), len(b.ids), 1)
    return np.array(
        [
            float(a.sentence @ b.sentence),
            worst_c[0],
            worst_c[1],
            (float(ca.mean()) + float(cb.mean())) / 2 if len(ca) and len(cb) else 0.0,
            worst_s[0],
            worst_s[1],
            (float(sa.mean()) + float(sb.mean())) / 2 if len(sa) and len(sb) else 0.0,
            poor[0],
            poor[1],
            abs(len(a.ids) - len(b.ids)) / longest,
            unshared[0],
            unshared[1],
            unshared_best,
            _inversions(a.ids, b.ids),
            *texts,
        ],
        dtype=np.float64,
    )
