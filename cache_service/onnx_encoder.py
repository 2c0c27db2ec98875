"""The embedding model's encoder run by ONNX Runtime: the same float32 arithmetic as torch, in half the time.

A ten-word question's pass through all-MiniLM-L6-v2 is ~40 small operators, and at that size torch's
per-operator dispatch costs as much as the arithmetic (figures: docs/STUDY_LOG.md, "The cache's embedder").
The graph is exported from the loaded transformers model
(so any model the embedder can load works) into a file named by a hash of its weights and of the exporting
libraries' versions, once per machine; later starts load the file. Beside it, the float32 vectors
sentence-transformers gave for a probe at export time: a later start checks the file against them without
loading sentence-transformers (seconds of imports).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Bumped when the export below changes, so files written by an older export are not reused.
EXPORT_VERSION = 2
INPUT_NAMES = ("input_ids", "attention_mask")
# The libraries whose code the export traces: after an upgrade of any of them the graph is exported again
# rather than a file traced from the old modelling code reused.
EXPORTERS = ("torch", "transformers", "onnx", "onnxruntime")


def exporter_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    return " ".join(f"{name}=={installed(name)}" for name in EXPORTERS)


def weights_digest(model_dir: str, exporters: str | None = None) -> str:
    """SHA-256 over the model directory's weight and config files (names and contents) and the exporting
    libraries' versions (`exporters`, default: those installed)."""
    exporters = exporter_versions() if exporters is None else exporters
    digest = hashlib.sha256(f"export-v{EXPORT_VERSION} {exporters}".encode())
    for name in sorted(os.listdir(model_dir)):
        if name.endswith((".safetensors", ".bin", ".json")) and os.path.isfile(os.path.join(model_dir, name)):
            digest.update(name.encode())
            with open(os.path.join(model_dir, name), "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def export(transformer: Any, tokenizer: Any, path: str) -> None:
    """Write the encoder (input ids and attention mask -> last hidden states) to `path`, atomically."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    # Two texts of different lengths: the traced graph then pads and masks as a real batch does.
    example = tokenizer(["an example", "a second, longer example text"], padding=True, return_tensors="pt")
    dynamic = {0: "batch", 1: "tokens"}
    outputs = ["hidden"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=os.path.dirname(path))
    os.close(fd)
    try:
        # The tracer warns about shape arithmetic it records as constants; the graph is checked against torch
        # on a padded batch by every Embedder at start (and by tests/cache/test_embedder_backends.py).
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Encoder(transformer).eval(),
                (example["input_ids"], example["attention_mask"]),
                tmp,
                input_names=list(INPUT_NAMES),
                output_names=outputs,
                dynamic_axes={name: dynamic for name in (*INPUT_NAMES, *outputs)},
                opset_version=17,
                dynamo=False,
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class OnnxEncoder:
    """Last hidden states (float32) of a batch through an ONNX Runtime session on `num_threads` threads."""

    def __init__(self, path: str, num_threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        # Threads that wait on a futex instead of spinning: a busy other core must not stall every operator
        # (the reason CACHE_EMBEDDING_THREADS defaults to 1, cache_service/embedder.py).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.path = path
        self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feed = dict(
            zip(INPUT_NAMES, (input_ids.astype(np.int64), attention_mask.astype(np.int64)), strict=True)
        )
        return self._session.run(None, feed)[0]


def export_path(model_dir: str, name: str, onnx_dir: str) -> str:
    return os.path.join(onnx_dir, f"{name}-{weights_digest(model_dir)}.onnx")


def reference_path(onnx_path: str) -> str:
    """Where the probe's reference vectors are kept beside an export."""
    return onnx_path.removesuffix(".onnx") + ".probe.npy"


def save_reference(onnx_path: str, vectors: np.ndarray) -> None:
    """Keep the probe's float32 reference vectors beside the export (atomically; skipped if unwritable)."""
    target = reference_path(onnx_path)
    try:
        fd, tmp = tempfile.mkstemp(suffix=".npy", dir=os.path.dirname(target))
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.asarray(vectors, dtype=np.float32))
        os.replace(tmp, target)
    except OSError as exc:
        log.warning("cannot keep the probe's reference vectors at %s (%s)", target, exc)


def open_checked_export(path: str, num_threads: int) -> tuple[OnnxEncoder, np.ndarray] | None:
    """An export written before, with the reference vectors kept beside it; None when either is missing or
    cannot be read (the caller then loads the model and exports again)."""
    if not (os.path.exists(path) and os.path.exists(reference_path(path))):
        return None
    try:
        return OnnxEncoder(path, num_threads), np.load(reference_path(path))
    except Exception as exc:  # a damaged file: written again by load_or_export
        log.warning("cannot load %s (%s)", path, exc)
        return None


def load_or_export(
    transformer: Any,
    tokenizer: Any,
    model_dir: str,
    name: str,
    onnx_dir: str,
    num_threads: int,
) -> OnnxEncoder:
    """The encoder of the model in `model_dir`: its file in `onnx_dir` if exported from these weights before,
    else exported now (~3 s for MiniLM, ~7 s for mpnet), into a temporary folder if onnx_dir is read-only."""
    path = export_path(model_dir, name, onnx_dir)
    filename = os.path.basename(path)
    if os.path.exists(path):
        try:
            return OnnxEncoder(path, num_threads)
        except Exception as exc:  # a file damaged after it was written: write it again
            log.warning("cannot load %s (%s): exporting it again", path, exc)
    log.info("exporting the embedding model to %s (once per machine and weights)", path)
    try:
        export(transformer, tokenizer, path)
    except OSError as exc:
        path = os.path.join(tempfile.gettempdir(), "llmserve-onnx", filename)
        log.warning("cannot write the ONNX export to %s (%s): using %s", onnx_dir, exc, path)
        export(transformer, tokenizer, path)
    return OnnxEncoder(path, num_threads)
