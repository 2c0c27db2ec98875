"""Second check on a candidate hit: would one answer serve both questions (and both conversations)?

Sentence embeddings put "turn on 2FA" next to "turn off 2FA" and "capital of France" next to "capital of
Germany", so a candidate above the similarity floor must also pass:

1. the vetoes (cache_service/pair_checks.py: different numbers, a negation on one side only), then
2. a classifier fitted on labelled pairs (the tuning split of bench/data/cache_pairs.jsonl, by
   `python -m cache_service.verifier_training`) over how well every word piece of one question finds its
   counterpart in the other (cache_service/pair_features.py) and the other cheap checks' objections
   (opposite words, dates, swapped units). It gives the probability that one answer
   serves both; the candidate passes at CACHE_VERIFIER_THRESHOLD or above (chosen on the tuning split).

A conversation is compared turn by turn (the partition already guarantees the same roles in the same
order): turns worded the same pass (case, punctuation, hyphens, spacing and articles aside:
pair_checks.wording, so "carry-on" = "carry on" and "7pm" = "7 pm"), every other turn must pass the
vetoes, the last turn (the question) must reach CACHE_VERIFIER_THRESHOLD and the least likely earlier turn
(the context: "I use a Mac", "My dog is a labrador") CACHE_CONTEXT_VERIFIER_THRESHOLD. Two thresholds
because the two are different questions: a context statement reworded scores lower than a reworded
question, and the traps among earlier turns (a changed fact) score far lower still (docs/SEMANTIC_CACHE.md,
"Conversations").
The pieces' states come from the forward pass that embedded each text (cache_service/token_states.py): the
query's user turns ride in its embedding batch, a stored entry's were computed when it was stored, so a
hit usually runs the model once. Whatever is missing (an entry stored by another replica, a text that fell
out of memory) is encoded on the embedding thread (MicroBatcher.run), once per lookup for all candidates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache_service import related_words, word_frequency
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, EMBEDDING_MODELS
from cache_service.keys import Conversation
from cache_service.pair_checks import expand_contractions, objections, same_wording, veto
from cache_service.pair_features import FEATURE_NAMES, pair_features, text_features
from cache_service.token_states import TokenEncoder
from cache_service.tree_ensemble import TreeEnsemble

MODEL_FILE = EMBEDDING_MODELS[DEFAULT_EMBEDDING_MODEL].verifier_file  # the default model's classifier
# The model reads ~256 word pieces: a longer text's tail would be invisible to it, so a longer turn (or last
# question) is reused only when it is the same text.
MAX_COMPARABLE_CHARS = 1000


@dataclass(frozen=True)
class Thresholds:
    """The classifier's probability a candidate must reach: on the question (a single question, or a
    conversation's last turn) and on every earlier turn that differs."""

    question: float
    context: float


@dataclass(frozen=True)
class Verdict:
    ok: bool
    question_probability: float  # 1.0 for identical texts, 0.0 when a check vetoed
    context_probability: float = 1.0  # the least likely earlier turn; 1.0 when none differs
    reason: str = ""

    @property
    def probability(self) -> float:
        return min(self.question_probability, self.context_probability)


def load_classifier(path: Path, embedding_model: str) -> TreeEnsemble:
    """The fitted trees (exported by cache_service.verifier_training); their feature list must be ours and
    they must have been fitted on the vectors of the model that will embed."""
    meta = json.loads(path.with_suffix(".json").read_text())
    if tuple(meta["features"]) != FEATURE_NAMES:
        raise RuntimeError(f"{path} was fitted on other features: run cache_service.verifier_training")
    if meta["embedding_model"] != embedding_model:
        raise RuntimeError(f"{path} was fitted on {meta['embedding_model']} vectors, not {embedding_model}")
    layers = EMBEDDING_MODELS[embedding_model].context_layers
    fitted = tuple(meta.get("context_layers", ()))
    if fitted != layers:
        raise RuntimeError(
            f"{path} was fitted on contextual vectors of layers {list(fitted)} and the last, not "
            f"{list(layers)}: run cache_service.verifier_training"
        )
    return TreeEnsemble.load(path)


def classifier_for(embedding_model: str) -> TreeEnsemble:
    """The classifier fitted on `embedding_model`'s vectors (cache_service/embedding_models.py)."""
    return load_classifier(EMBEDDING_MODELS[embedding_model].verifier_file, embedding_model)


def fitted_embedding_dtype(path: Path = MODEL_FILE) -> str:
    """The embedder weights whose vectors the shipped classifier was fitted on: its thresholds hold for them.
    (Vectors of another type move its features enough to change verdicts: on an AVX512-BF16 machine, bfloat16
    vectors turned a paraphrase the float32 ones let through into a miss.)"""
    return str(json.loads(path.with_suffix(".json").read_text())["embedding_dtype"])


class PairVerifier:
    def __init__(self, encoder: TokenEncoder, classifier: TreeEnsemble | None = None) -> None:
        self._encoder = encoder
        self._classifier = classifier if classifier is not None else classifier_for(DEFAULT_EMBEDDING_MODEL)
        related_words.load()  # ~0.2 s: now, not in the first lookup (which a gateway may time out)
        word_frequency.load()  # ~0.1 s, likewise

    def probabilities(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Per turn pair (contractions expanded): the classifier's probability that one answer serves
        both. Every text is encoded in one batch."""
        if not pairs:
            return np.zeros(0)
        texts = sorted({t for pair in pairs for t in pair})
        states = dict(zip(texts, self._encoder.encode_tokens(texts), strict=True))
        features = np.stack([pair_features(states[a], states[b], text_features(a, b)) for a, b in pairs])
        return self._classifier.probability(features)

    def judge(
        self, query: Conversation, candidates: list[Conversation], thresholds: Thresholds
    ) -> list[Verdict]:
        """One verdict per candidate (same order). Every text still in question is encoded in one batch."""
        pending: list[list[tuple[bool, tuple[str, str]]]] = []
        vetoed: list[str] = []
        for cand in candidates:
            pairs, reason = _differing_turns(query, cand)
            pending.append([] if reason else pairs)
            vetoed.append(reason)
        flat = [pair for pairs in pending for _, pair in pairs]
        probs = iter(self.probabilities(flat).tolist())
        out = []
        for pairs, reason in zip(pending, vetoed, strict=True):
            if reason:
                out.append(Verdict(False, 0.0, 0.0, reason))
                continue
            question, context = 1.0, 1.0
            question_pair = context_pair = ("", "")
            for is_last, pair in pairs:
                p = next(probs)
                if is_last:
                    question, question_pair = p, pair
                elif p < context:
                    context, context_pair = p, pair
            if question < thresholds.question:
                why = _refusal("verifier: different question", question_pair)
            elif context < thresholds.context:
                why = _refusal("verifier: different context", context_pair)
            else:
                why = ""
            out.append(Verdict(not why, question, context, why))
        return out


def _refusal(why: str, pair: tuple[str, str]) -> str:
    """The refusal, with the cheap checks that objected to the pair ("... (opposite_words)")."""
    objecting = objections(*pair)
    return f"{why} ({', '.join(objecting)})" if objecting else why


def verifier_texts(conversation: Conversation) -> tuple[str, ...]:
    """The texts of a conversation the verifier may encode: its user turns as the verifier reads them
    (contractions expanded). Assistant turns, long and nearly always identical, are left to the verifier."""
    return tuple(
        expand_contractions(text)
        for role, text in conversation.turns
        if role == "user" and len(text) <= MAX_COMPARABLE_CHARS
    )


def _differing_turns(a: Conversation, b: Conversation) -> tuple[list[tuple[bool, tuple[str, str]]], str]:
    """The turn pairs that are worded differently (contractions expanded), each marked True when it is the
    last turn (the question), or a veto."""
    if len(a.turns) != len(b.turns):
        return [], "conversation length differs"
    pairs = []
    last = len(a.turns) - 1
    for i, ((role_a, text_a), (role_b, text_b)) in enumerate(zip(a.turns, b.turns, strict=True)):
        if role_a != role_b:
            return [], "roles differ"
        text_a, text_b = expand_contractions(text_a), expand_contractions(text_b)
        if same_wording(text_a, text_b):
            continue
        if max(len(text_a), len(text_b)) > MAX_COMPARABLE_CHARS:
            return [], "a long turn differs"
        reason = veto(text_a, text_b)
        if reason:
            return [], reason
        pairs.append((i == last, (text_a, text_b)))
    return pairs, ""
