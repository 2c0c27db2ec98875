"""The cross-encoder half of the verifier and the recipe that trains it (cache_service/cross_encoder.py,
cache_service/verifier_training.py)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def shipped():
    from cache_service.cross_encoder import CrossEncoder

    return CrossEncoder()


def test_scores_do_not_depend_on_which_question_was_stored(shipped) -> None:
    a, b = "How do I turn on dark mode?", "How can I enable dark mode?"
    forward, backward = shipped.probabilities([(a, b), (b, a)])
    assert forward == pytest.approx(backward, abs=1e-6)
    assert 0.0 <= forward <= 1.0


def test_shipped_adapter_separates_a_rewording_from_another_question(shipped) -> None:
    same, other = shipped.probabilities(
        [
            ("What is the boiling point of water?", "At what temperature does water boil?"),
            ("What is the boiling point of water?", "What is the freezing point of water?"),
        ]
    )
    assert same > other


def test_merged_adapters_compute_what_training_computed() -> None:
    """CrossEncoder merges W + B A into the weights; training adds x A^T B^T beside the frozen layer. Both
    must give the same logits for the same (random, non-trivial) adapter."""
    from cache_service.cross_encoder import CrossEncoder, adapted_linears, load_encoder, pair_logits
    from cache_service.verifier_training import RANK, _add_adapter

    gen = torch.Generator().manual_seed(3)
    encoder, tokenizer = load_encoder()
    encoder.eval()
    arrays = {}
    for name, linear in adapted_linears(encoder):
        a = torch.randn(RANK, linear.in_features, generator=gen) * 0.05
        b = torch.randn(linear.out_features, RANK, generator=gen) * 0.05
        _add_adapter(linear, a, b)
        arrays[f"{name}.a"], arrays[f"{name}.b"] = a.numpy(), b.numpy()
    head = torch.nn.Linear(encoder.config.hidden_size, 1)
    arrays["head.weight"] = head.weight.detach().numpy()
    arrays["head.bias"] = head.bias.detach().numpy()
    x, y = ["Where is the nearest pharmacy?", "Is it safe?"], ["Which pharmacy is closest?", "Is it risky?"]
    with torch.no_grad():
        training = torch.sigmoid(
            (pair_logits(encoder, tokenizer, head, x, y) + pair_logits(encoder, tokenizer, head, y, x)) / 2
        )
    merged = CrossEncoder(arrays).probabilities(list(zip(x, y, strict=True)))
    np.testing.assert_allclose(merged, training.numpy(), atol=2e-5)
    no_op = {k: (np.zeros_like(v) if k.endswith(".b") else v) for k, v in arrays.items()}
    assert not np.allclose(merged, CrossEncoder(no_op).probabilities(list(zip(x, y, strict=True))), atol=1e-3)


def test_training_rows_never_include_the_test_split_or_the_held_out_fold() -> None:
    from cache_service.verifier_training import FOLDS, fold_of, load_rows, tune_rows

    rows = load_rows()
    everything = tune_rows(rows)
    assert everything and all(r["split"] == "tune" for r in everything)
    for fold in range(FOLDS):
        kept = tune_rows(rows, held_out_fold=fold)
        assert all(fold_of(r["topic"]) != fold for r in kept)
        assert len(kept) < len(everything)
