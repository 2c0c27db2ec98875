"""The verifier: its cheap checks (pure functions), conversation keys, and the learned models (trees and
cross-encoder) on the real embedding model (the one the service runs; nothing is fetched: HF_HUB_OFFLINE)."""

from __future__ import annotations

import os

import pytest

from cache_service.embedding_models import EMBEDDING_MODELS
from cache_service.keys import Conversation, parse_key
from cache_service.pair_checks import objections, veto
from cache_service.settings import CacheSettings
from common.gen import cache_pb2

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DEFAULTS = CacheSettings().verifier_thresholds()


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("How many ounces are in 2 pounds?", "How many ounces are in 3 pounds?", "numbers"),
        ("What is 15% of 80?", "What is 15% of 60?", "numbers"),
        ("Who won in 2018?", "Who won in 2014?", "numbers"),
        ("Can I check in at 3:30?", "Can I check in at 3:45?", "numbers"),
        ("Is $10k a good salary?", "Is $100k a good salary?", "numbers"),
        ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?", "negation"),
        ("Why does my code compile?", "Why doesn't my code compile?", "negation"),
        ("How do I bake bread with yeast?", "How do I bake bread without yeast?", "negation"),
        ("Is it legal to park on the sidewalk?", "Is it illegal to park on the sidewalk?", "negation"),
        (
            "How do I hide a column in my spreadsheet?",
            "How do I unhide a column in my spreadsheet?",
            "negation",
        ),
        (
            "What are the advantages of leasing a car?",
            "What are the disadvantages of leasing a car?",
            "negation",
        ),
        ("Solve 3x + 7 = 22", "Solve 3x + 7 > 22", "relations"),
        ("Is x <= 5 here?", "Is x >= 5 here?", "relations"),
    ],
)
def test_cheap_checks_veto(a: str, b: str, reason: str) -> None:
    assert reason in veto(a, b)


@pytest.mark.parametrize(
    ("a", "b", "objection"),
    [
        ("Is the museum open on Friday?", "Is the museum open on Tuesday?", "dates_differ"),
        (
            "What's the weather in Lisbon in April?",
            "What's the weather in Lisbon in November?",
            "dates_differ",
        ),
        ("How many grams are in 2 pounds?", "How many pounds are in 2 grams?", "numbers_count_swapped"),
        ("Convert 10 miles to kilometers", "Convert 10 kilometers to miles", "numbers_count_swapped"),
        ("Should I buy gold now?", "Should I sell gold now?", "opposite_words"),
        ("What is the highest point in Texas?", "What is the lowest point in Texas?", "opposite_words"),
        (
            "Is it cheaper to fly or drive to Denver?",
            "Is it more expensive to fly or drive to Denver?",
            "opposite_words",
        ),
        ("How do I increase the font size?", "How do I decrease the font size?", "opposite_words"),
        # A number on one side only is as often a rewording ("merge two branches" / "merge one branch into
        # another") as a changed quantity.
        ("How many ounces are in a pound?", "How many ounces are in 3 pounds?", "numbers_one_side"),
        (
            "How do I freeze the top row in Excel?",
            "How do I freeze the top 2 rows in Excel?",
            "numbers_one_side",
        ),
        # Negation without a negator, and a question that asks for something else about the same thing.
        (
            "What should I do when I remove a stinger?",
            "What should I avoid when I remove a stinger?",
            "implicit_negation",
        ),
        (
            "How do I clean my camera sensor?",
            "How do I stop dust getting on my camera sensor?",
            "implicit_negation",
        ),
        ("Why is the sky blue?", "When is the sky blue?", "question_focus_differs"),
        (
            "How long does pasta keep in the fridge?",
            "How much pasta fits in the fridge?",
            "question_focus_differs",
        ),
    ],
)
def test_other_checks_object_without_vetoing(a: str, b: str, objection: str) -> None:
    """Rewordings trip these too, so they are the classifier's features, not vetoes."""
    assert veto(a, b) == ""
    assert objections(a, b) == [objection]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What gift suits a 25th anniversary?", "What gift suits a twenty-fifth anniversary?"),
        ("Is 1,000 people a big crowd?", "Is 1000 people a big crowd?"),
        ("Does the train run on Sundays?", "Are there trains on a Sunday?"),
        ("How much sleep does a teen need?", "How many hours should a teen sleep each night?"),
        ("Can I make it with no eggs?", "Can I make it without eggs?"),
        ("Why can't I log in?", "Why am I not able to log in?"),
        ("How do I join three tables in SQL?", "How can I join three SQL tables?"),
        ("Convert 5 km to miles", "How many miles is 5 km?"),
        ("How do I run a cron job at 3am?", "What crontab line runs a job daily at 3:00 in the morning?"),
        ("Do I file taxes if I made $10,000?", "Must I file a return on $10k of income?"),
        ("How many cups are in 2 liters?", "How many cups make 2 litres?"),
        ("Is it possible to recover deleted files?", "Can deleted files be recovered?"),
        ("What does an index do in a database?", "What is a database index for?"),
        ("Why is my phone unable to connect?", "Why is my phone unable to get a connection?"),
        ("How do I unlock and lock my car remotely?", "How can I lock and unlock my car from afar?"),
        # Opposites both sides name are no opposition; inflections are not antonyms of their base.
        ("Which is bigger, the sun or the moon?", "Is the moon smaller or bigger than the sun?"),
        ("What are the pros and cons of renting?", "What are the cons and pros of renting?"),
        ("How do I turn on airplane mode and off again?", "How do I switch airplane mode on and off?"),
        ("What sold best last year?", "What were the best sellers last year?"),
    ],
)
def test_cheap_checks_let_rewordings_through(a: str, b: str) -> None:
    """No veto, and no objection but the weakest: a question reworded often asks with another question word
    ("Convert 5 km to miles" / "How many miles is 5 km?"), which the classifier weighs against the rest."""
    assert veto(a, b) == "" and set(objections(a, b)) <= {"question_focus_differs"}


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Can I bring a laptop in my carry-on bag?", "can i bring a laptop in my carry on bag", True),
        ("How do I book a table for 4 at 7 pm?", "How do I book a table for 4 at 7pm?", True),
        ("How do I decline an invite from a co-worker?", "how do I decline an invite from a coworker", True),
        ("Is $3,000 enough?", "Is $3000 enough?", True),
        ("How long before the second coat?", "How long before a second coat?", True),
        ("What does 'ubiquitous' mean?", "What does ubiquitous mean?", True),
        ("WHAT IS THE BOILING POINT OF WATER", "What is the boiling point of water?", True),
        ("Is 3.5 GB enough?", "Is 35 GB enough?", False),  # a decimal point is not punctuation
        ("Is C++ hard to learn?", "Is C hard to learn?", False),
        ("How much vitamin A per day?", "How much vitamin per day?", False),  # a capital A mid-text is a name
        ("Is 15% of 80 a lot?", "Is 15 of 80 a lot?", False),
        ("Solve 3x + 7 = 22", "Solve 3x + 7 > 22", False),  # a relation of arithmetic is no punctuation
        ("How often should I water my snake plant?", "How often should I water a snake plant?", False),
    ],
)
def test_turns_worded_the_same_skip_the_models(a: str, b: str, same: bool) -> None:
    from cache_service.pair_checks import same_wording

    assert same_wording(a, b) is same


@pytest.mark.parametrize(
    ("typed", "read"),
    [
        ("whats the longest river in africa", "what is the longest river in africa"),
        ("Why doesnt my router reset?", "Why does not my router reset?"),
        ("Why cant I log in", "Why cannot I log in"),
        ("im sure youre right", "i am sure you are right"),
        ("Why doesn’t it work?", "Why does not it work?"),
        # Bare forms that are words of their own stay words.
        ("Were its shops open well into the night?", "Were its shops open well into the night?"),
        ("Wont the shell crack?", "Wont the shell crack?"),
    ],
)
def test_contractions_are_read_with_or_without_the_apostrophe(typed: str, read: str) -> None:
    from cache_service.pair_checks import expand_contractions

    assert expand_contractions(typed) == read


def test_a_contraction_typed_without_its_apostrophe_is_the_same_question_or_a_negation() -> None:
    from cache_service.pair_checks import expand_contractions, same_wording

    assert same_wording(
        expand_contractions("whats the longest river in africa"),
        expand_contractions("What's the longest river in Africa?"),
    )
    asked, stored = "Why does my router reset?", "Why doesnt my router reset?"
    assert veto(expand_contractions(asked), expand_contractions(stored)) == "negation differs"


def chat(*turns: tuple[str, str], system: str | None = None, scope: str = "s") -> cache_pb2.CacheKey:
    messages = [cache_pb2.Message(role="system", content=system)] if system else []
    messages += [cache_pb2.Message(role=r, content=c) for r, c in turns]
    return cache_pb2.CacheKey(model="m", scope=scope, messages=messages, params_fingerprint="f")


def test_conversation_key_compares_turns_by_meaning_and_the_rest_exactly() -> None:
    mac = parse_key(
        chat(("user", "I use a Mac."), ("assistant", "Noted."), ("user", "How do I install Python?"))
    )
    reworded = parse_key(
        chat(
            ("user", "My computer is a Mac."), ("assistant", "Noted."), ("user", "How can I install Python?")
        )
    )
    assert mac.partition == reworded.partition  # same shape: found by the search, judged by the verifier
    assert mac.entry_id != reworded.entry_id
    assert mac.query == "I use a Mac.\nHow do I install Python?"  # the user's turns, searched together
    assert Conversation.decode(mac.stored_text) == mac.conversation
    assert Conversation.decode("plain question") == Conversation((("user", "plain question"),))
    same_words = parse_key(
        chat(("user", "i use a mac"), ("assistant", "Noted."), ("user", "how do I install python"))
    )
    assert same_words.entry_id == mac.entry_id  # normalized turns: an exact hit
    for other in (
        chat(("user", "How do I install Python?")),  # other shape
        chat(
            ("user", "I use a Mac."),
            ("assistant", "Noted."),
            ("user", "How do I install Python?"),
            system="Be brief.",
        ),
        chat(
            ("user", "I use a Mac."), ("assistant", "Noted."), ("user", "How do I install Python?"), scope="t"
        ),
    ):
        assert parse_key(other).partition != mac.partition


@pytest.fixture(scope="module")
def verifier():
    from cache_service.embedder import Embedder
    from cache_service.verifier import PairVerifier

    return PairVerifier(Embedder())


@pytest.fixture(scope="module", params=sorted(EMBEDDING_MODELS))
def model_verifier(request):
    """Each embedding model's verifier (its own classifier) with its own default thresholds."""
    from cache_service.embedder import Embedder
    from cache_service.verifier import PairVerifier, Thresholds, classifier_for

    model = EMBEDDING_MODELS[request.param]
    verifier = PairVerifier(Embedder(model=model.name), classifier_for(model.name))
    return verifier, Thresholds(model.verifier_threshold, model.context_verifier_threshold)


def conv(*texts: str) -> Conversation:
    return Conversation(tuple(("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I reset my password?", "What is the way to reset my password?"),
        ("What is the capital of France?", "Which city is France's capital?"),
        ("How do I brew green tea?", "What is the way to brew green tea?"),
    ],
)
def test_classifier_accepts_rewordings(model_verifier, a: str, b: str) -> None:
    verifier, thresholds = model_verifier
    verdict = verifier.judge(conv(a), [conv(b)], thresholds)[0]
    assert verdict.ok, verdict


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I turn on dark mode?", "How do I turn off dark mode?"),
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("Who wrote Macbeth?", "Who wrote Hamlet?"),
        ("Convert 5 km to miles", "Convert 5 miles to km"),
    ],
)
def test_classifier_refuses_other_questions(model_verifier, a: str, b: str) -> None:
    verifier, thresholds = model_verifier
    verdict = verifier.judge(conv(a), [conv(b)], thresholds)[0]
    assert not verdict.ok and verdict.question_probability < thresholds.question


def test_a_refusal_names_the_checks_that_objected(model_verifier) -> None:
    verifier, thresholds = model_verifier
    verdict = verifier.judge(conv("Should I buy gold now?"), [conv("Should I sell gold now?")], thresholds)[0]
    assert not verdict.ok and verdict.reason == "verifier: different question (opposite_words)"


def test_verifier_passes_turns_worded_the_same_without_the_classifier(verifier) -> None:
    """ "carry-on" / "carry on" differ in word pieces (the classifier scores such pairs well under the
    threshold); worded the same, they pass as identical text, probability 1.0."""
    a, b = "Can I bring a laptop in my carry-on bag?", "can i bring a laptop in my carry on bag"
    assert verifier.probabilities([(a, b)])[0] < DEFAULTS.question
    verdict = verifier.judge(conv(a), [conv(b)], DEFAULTS)[0]
    assert verdict.ok and verdict.question_probability == 1.0


def test_conversations_are_judged_turn_by_turn(verifier) -> None:
    france = conv("What is the capital of France?", "Paris.", "What was the population of Paris in 2000?")
    reworded = conv("Which city is France's capital?", "Paris.", "What was the population of Paris in 2000?")
    germany = conv("What is the capital of Germany?", "Berlin.", "What was the population of Paris in 2000?")
    tripled = conv("What is the capital of France?", "Paris.", "What was the population of Paris in 1900?")
    same, other, numbers = verifier.judge(france, [reworded, germany, tripled], DEFAULTS)
    assert same.ok
    assert not other.ok and other.reason == "verifier: different context"
    assert other.question_probability == 1.0  # the last question is the same text
    assert not numbers.ok
    assert numbers.reason == "numbers differ"  # vetoed before the classifier: probability 0
    assert verifier.judge(france, [france], DEFAULTS)[0].probability == 1.0


def test_earlier_turns_and_the_question_have_their_own_thresholds(verifier) -> None:
    from cache_service.verifier import Thresholds

    mac = conv("I use a Mac with macOS Sonoma.", "Thanks, noted.", "How do I install Python?")
    reworded = conv(
        "My computer is a Mac running macOS Sonoma.", "Thanks, noted.", "How do I install Python?"
    )
    verdict = verifier.judge(mac, [reworded], Thresholds(0.0, 0.0))[0]
    assert verdict.question_probability == 1.0 and 0.0 < verdict.context_probability < 1.0
    p = verdict.context_probability
    # Only the earlier-turn threshold decides here: a question threshold above p does not refuse it.
    assert verifier.judge(mac, [reworded], Thresholds(question=1.0, context=p))[0].ok
    refused = verifier.judge(mac, [reworded], Thresholds(question=0.0, context=min(1.0, p + 1e-6)))[0]
    assert not refused.ok and refused.reason == "verifier: different context"
    # And a single question is judged on the question threshold alone, whatever the context one.
    tea = verifier.judge(
        conv("How do I make green tea?"), [conv("What is the way to brew green tea?")], Thresholds(0.0, 1.0)
    )
    assert tea[0].ok and tea[0].context_probability == 1.0


def test_tree_ensemble_matches_scikit_learn(tmp_path) -> None:
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier

    from cache_service.tree_ensemble import TreeEnsemble

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0.3) | (x[:, 3] > 1.2)
    model = HistGradientBoostingClassifier(max_depth=3, max_iter=40, random_state=0).fit(x, y)
    TreeEnsemble.from_sklearn(model).save(tmp_path / "trees.npz")
    trees = TreeEnsemble.load(tmp_path / "trees.npz")
    probe = rng.normal(size=(64, 5))
    np.testing.assert_allclose(trees.probability(probe), model.predict_proba(probe)[:, 1], atol=1e-12)


def test_antonym_table_is_wordnet_and_reads_inflections() -> None:
    from cache_service.pair_checks import _antonym_table, base_forms

    pairs, inflections = _antonym_table()
    assert len(pairs) > 5000  # both directions of ~3,200 WordNet pairs, not a hand-picked list
    assert ("sell", "buy") in pairs and ("buy", "sell") in pairs
    assert inflections["sold"] == "sell"
    assert {"high"} <= base_forms("highest") and {"stop"} <= base_forms("stopped")


def test_training_rows_never_include_the_test_split_or_the_held_out_fold() -> None:
    from cache_service.verifier_training import FOLDS, fold_of, load_rows, tune_rows

    rows = load_rows()
    everything = tune_rows(rows)
    assert everything and all(r["split"] == "tune" for r in everything)
    for fold in range(FOLDS):
        kept = tune_rows(rows, held_out_fold=fold)
        assert all(fold_of(r["topic"]) != fold for r in kept)
        assert len(kept) < len(everything)


def test_no_tuning_pair_shares_a_question_with_a_frozen_split() -> None:
    """Writers reach for the same common questions; the build drops tuning pairs that hold a frozen one."""
    from bench.data.build_cache_pairs import user_texts
    from cache_service.verifier_training import load_rows

    rows = load_rows()
    splits = {r["split"] for r in rows}
    assert {"tune", "test", "external", "fresh"} <= splits
    frozen = set().union(*(user_texts(r) for r in rows if r["split"] != "tune"))
    assert not any(user_texts(r) & frozen for r in rows if r["split"] == "tune")


def test_reviewed_duplicates_join_tuning_groups_and_never_frozen_ones(tmp_path, monkeypatch) -> None:
    """Two writers asking the same thing in two seeds: a reviewer's "same answer" joins their groups in the
    tuning split (a right answer is then no wrong neighbour there); frozen groups stay as written."""
    import bench.cache_quality as quality
    from cache_service.verifier_training import load_rows

    rows, reviewed = load_rows(), quality.DUPLICATES
    joined = quality.evaluation_rows(rows)
    monkeypatch.setattr(quality, "DUPLICATES", tmp_path / "none.jsonl")
    (tmp_path / "none.jsonl").write_text("")
    unjoined = quality.evaluation_rows(rows)
    assert [r["id"] for r in joined] == [r["id"] for r in unjoined]
    frozen = [(a, b) for a, b in zip(joined, unjoined, strict=True) if a["split"] != "tune"]
    assert frozen and all((a["a_group"], a["b_group"]) == (b["a_group"], b["b_group"]) for a, b in frozen)
    group_of = {
        r[s]: r[f"{s}_group"] for r in joined if r["split"] == "tune" for s in "ab" if isinstance(r[s], str)
    }
    pairs = load_rows(reviewed)
    same = [p for p in pairs if p["same_answer"] and p["q1"] in group_of and p["q2"] in group_of]
    different = [p for p in pairs if not p["same_answer"] and p["q1"] in group_of and p["q2"] in group_of]
    assert len(same) > 20 and all(group_of[p["q1"]] == group_of[p["q2"]] for p in same)
    assert sum(group_of[p["q1"]] != group_of[p["q2"]] for p in different) > 0.9 * len(different)
    assert sum(a["b_group"] != b["b_group"] for a, b in zip(joined, unjoined, strict=True)) > 0


def test_no_tuning_pair_holds_a_question_judged_to_ask_a_frozen_one() -> None:
    """Near-duplicates of frozen questions (a reviewer said "same answer") are leakage too: the build drops
    them."""
    import json

    from bench.data.build_cache_pairs import FROZEN_DUPLICATES, user_texts
    from cache_service.keys import normalize_text
    from cache_service.verifier_training import load_rows

    judged = [json.loads(line) for line in FROZEN_DUPLICATES.read_text().splitlines()]
    leaked = {normalize_text(p["q1"]) for p in judged if p["same_answer"]}
    assert len(leaked) > 10 and len(judged) > len(leaked)
    rows = load_rows()
    assert not any(user_texts(r) & leaked for r in rows if r["split"] == "tune")
    frozen = set().union(*(user_texts(r) for r in rows if r["split"] != "tune"))
    assert {normalize_text(p["q2"]) for p in judged} <= frozen
