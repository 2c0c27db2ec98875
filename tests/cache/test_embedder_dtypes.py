"""The embedder's weight types against its float32 reference (the real packaged model, in process)."""

from __future__ import annotations

import numpy as np
import pytest

from cache_service.embedder import Embedder, resolve_dtype
from common.linear import bf16_weight_ops

QUESTIONS = [
    "How do I reset my router to factory settings?",
    "What's the procedure for a factory reset on my router?",
    "Is it safe to eat raw eggs?",
    "I'm moving to Berlin next month.\nHow do I register my address?",
]


def test_auto_is_the_type_the_thresholds_were_calibrated_on_whatever_the_cpu() -> None:
    assert resolve_dtype("auto") == "float32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("int8")


def test_bfloat16_weights_give_the_float32_vectors_to_rounding() -> None:
    if bf16_weight_ops() is None:
        pytest.skip("native kernels not built (make kernels)")
    reference = Embedder(dtype="float32")
    reduced = Embedder(dtype="bfloat16-weights")
    assert reduced.dtype == "bfloat16-weights" and reduced.packed_layers == 37  # every linear of the encoder
    a, b = reference.encode(QUESTIONS), reduced.encode(QUESTIONS)
    assert b.dtype == np.float32 and np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(a.astype(np.float64) * b, axis=1)
    assert cosines.min() >= 0.99995, cosines
    assert not np.array_equal(a, b)  # the weights really were rounded
