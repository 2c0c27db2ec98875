"""The embedder's ONNX Runtime backend against torch (the real packaged model, in process)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from cache_service.embedder import PROBE, Embedder, resolve_backend
from cache_service.onnx_encoder import exporter_versions, reference_path, weights_digest

# Lengths from 3 to ~300 word pieces (the last is cut at the model's 256), so the batch is padded and
# truncated: the exported graph must mask as the model does.
TEXTS = [
    "hi",
    "How do I reset my router to factory settings?",
    "I'm moving to Berlin next month.\nHow do I register my address, and which documents do I bring?",
    " ".join(f"word{i}" for i in range(150)),
]


@pytest.fixture(scope="module")
def torch_embedder() -> Embedder:
    return Embedder(backend="torch")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One export the tests read (an export takes seconds); a test that damages it works on a copy."""
    folder = str(tmp_path_factory.mktemp("onnx"))
    Embedder(onnx_dir=folder)
    return folder


def copy_of(export_dir: str, tmp_path) -> str:
    return shutil.copytree(export_dir, tmp_path / "onnx")


def test_auto_runs_float32_on_onnxruntime_and_bf16_on_torch() -> None:
    assert resolve_backend("auto", "float32") == "onnxruntime"
    assert resolve_backend("auto", "bfloat16") == "torch"
    assert resolve_backend("torch", "float32") == "torch"
    with pytest.raises(ValueError, match="float32 only"):
        resolve_backend("onnxruntime", "bfloat16-weights")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("tensorrt", "float32")


def test_onnxruntime_gives_torchs_vectors_on_a_padded_batch(
    export_dir: str, torch_embedder: Embedder
) -> None:
    embedder = Embedder(onnx_dir=export_dir)
    assert embedder.backend == "onnxruntime" and torch_embedder.backend == "torch"
    assert np.allclose(embedder.encode(TEXTS), torch_embedder.encode(TEXTS), atol=1e-5)
    assert embedder._transformer is None, "torch's copy of the weights is let go: ONNX Runtime has its own"


def test_token_ids_give_the_texts_vectors_whatever_they_are_batched_with(torch_embedder: Embedder) -> None:
    """Lookups' texts go in as ids, padded beside other requests' inputs: the same vector as the text alone
    (the longest text cut at the model's length, as sentence-transformers cuts it)."""
    rows = torch_embedder.tokenize(TEXTS)
    assert max(len(r) for r in rows) == torch_embedder.max_tokens
    together = torch_embedder.encode_ids(rows)
    for text, vector in zip(TEXTS, together, strict=True):
        assert np.allclose(vector, torch_embedder.encode([text])[0], atol=1e-5)


def test_the_export_is_written_once_and_reused(tmp_path) -> None:
    first = Embedder(onnx_dir=str(tmp_path))
    exported = sorted(os.listdir(tmp_path))
    assert exported == sorted(
        [os.path.basename(first._onnx.path), os.path.basename(reference_path(first._onnx.path))]
    )
    written = os.stat(first._onnx.path).st_mtime_ns
    second = Embedder(onnx_dir=str(tmp_path))
    assert second._onnx.path == first._onnx.path and os.stat(second._onnx.path).st_mtime_ns == written
    assert sorted(os.listdir(tmp_path)) == exported  # no temporary file left behind
    assert np.allclose(second.encode(TEXTS), first.encode(TEXTS), atol=1e-6)
    assert (second.max_tokens, second.dim, len(second.tokenizer)) == (
        first.max_tokens,
        first.dim,
        len(first.tokenizer),
    )


def test_a_start_from_the_export_needs_no_sentence_transformers(export_dir: str) -> None:
    """Later starts read the export, the tokenizer and the sentence settings alone (sentence-transformers'
    and transformers' imports cost seconds), and check the export's probe vectors against those kept at
    export time."""
    path = Embedder(onnx_dir=export_dir)._onnx.path
    code = (
        "import sys, numpy as np; from cache_service.embedder import Embedder, PROBE; "
        f"e = Embedder(onnx_dir={export_dir!r}); "
        "assert 'sentence_transformers' not in sys.modules, 'imported'; "
        "assert 'transformers' not in sys.modules, 'transformers imported'; "
        "print(e._onnx.path); np.save(sys.stdout.buffer, e.encode(PROBE))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        check=True,
        env=os.environ | {"PYTHONPATH": os.getcwd()},
    )
    assert out.stdout.startswith(path.encode() + b"\n")
    vectors = np.load(io.BytesIO(out.stdout[len(path) + 1 :]))
    assert np.allclose(vectors, np.load(reference_path(path)), atol=1e-5)


def test_an_export_that_disagrees_with_its_reference_is_checked_against_the_model(
    export_dir: str, tmp_path
) -> None:
    folder = copy_of(export_dir, tmp_path)
    path = Embedder(onnx_dir=folder)._onnx.path
    np.save(reference_path(path), -np.load(reference_path(path)))  # the kept reference now contradicts it
    # Checked against sentence-transformers instead, which agrees with the export: the reference is rewritten.
    embedder = Embedder(onnx_dir=folder)
    assert np.allclose(np.load(reference_path(path)), embedder.encode(PROBE), atol=1e-5)


def test_a_damaged_export_is_written_again(export_dir: str, tmp_path) -> None:
    folder = copy_of(export_dir, tmp_path)
    path = Embedder(onnx_dir=folder)._onnx.path
    with open(path, "r+b") as f:
        f.truncate(1000)
    embedder = Embedder(onnx_dir=folder)
    assert embedder._onnx.path == path and os.path.getsize(path) > 1_000_000
    assert np.allclose(np.linalg.norm(embedder.encode(TEXTS), axis=1), 1.0, atol=1e-5)


def test_an_unwritable_folder_falls_back_to_a_temporary_one(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    embedder = Embedder(onnx_dir=str(blocker / "onnx"))
    assert embedder._onnx.path.startswith(os.path.join(tempfile.gettempdir(), "llmserve-onnx"))


def test_the_export_is_named_by_the_weights(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights one")
    (tmp_path / "README.md").write_text("not part of the model")
    before = weights_digest(str(tmp_path))
    (tmp_path / "README.md").write_text("edited")
    assert weights_digest(str(tmp_path)) == before
    (tmp_path / "model.safetensors").write_bytes(b"weights two")
    assert weights_digest(str(tmp_path)) != before


def test_the_export_is_named_by_the_exporting_libraries_too(tmp_path) -> None:
    """An upgrade of torch or transformers (whose modelling code the export traces) exports again."""
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    installed = weights_digest(str(tmp_path))
    assert weights_digest(str(tmp_path), exporter_versions()) == installed
    assert weights_digest(str(tmp_path), exporter_versions().replace("torch==", "torch==0")) != installed
