"""Study, tuning split only: can all-mpnet-base-v2 run in 8-bit integers with its vectors intact?

mpnet serves far more rewordings than MiniLM (docs/SEMANTIC_CACHE.md, "The opt-in model") but its float32 pass
takes ~35-45 ms here. ONNX Runtime's dynamic int8 (8-bit weights, activations quantized on the fly with one
scale per tensor) is ~3x faster, but a few channels of some linear layers' inputs are 30-100x larger than the
rest, and one scale per tensor leaves the others a handful of levels. SmoothQuant's remedy moves part of each
input channel's range into the weights: x @ W = (x / s) @ (s * W), with s_j = max|x_j|^alpha /
max|W_j|^(1 - alpha) measured on calibration questions (a division inserted before each linear layer; exact in
float). For each alpha, the export is quantized (weights per tensor or per output channel) and compared with
float32 over held-apart tuning questions: the sentence vectors' cosine, and one question's pass time on one
and two threads. Calibration and comparison use the tuning split's questions only. Prints figures; nothing is
shipped from it.

    .venv/bin/python -m bench.cache_int8_study [--alphas 0 0.5 0.75 0.9]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import tempfile
import time

import numpy as np
import torch

from cache_service.embedding_models import MPNET, embedding_model
from cache_service.onnx_encoder import INPUT_NAMES, export
from cache_service.verifier_training import load_rows

CALIBRATION, COMPARED = 400, 200


class Smoothed(torch.nn.Module):
    """A linear layer whose input channels are divided by s and its weight's columns multiplied by s."""

    def __init__(self, linear: torch.nn.Linear, scale: torch.Tensor) -> None:
        super().__init__()
        with torch.no_grad():
            linear.weight.mul_(scale[None, :])
        self.register_buffer("inverse", 1.0 / scale)
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inverse)


def input_ranges(model, tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """Per linear layer of the encoder, the largest |input| of each channel over `texts`."""
    ranges: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_module, inputs, _output) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0)
            ranges[name] = torch.maximum(ranges[name], x) if name in ranges else x

        return record

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in model.encoder.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]
    with torch.no_grad():
        for start in range(0, len(texts), 32):
            model(**tokenizer(texts[start : start + 32], padding=True, return_tensors="pt"))
    for handle in handles:
        handle.remove()
    return ranges


def smooth(model, ranges: dict[str, torch.Tensor], alpha: float) -> None:
    for name, x_max in ranges.items():
        parent_name, child = name.rsplit(".", 1)
        parent = model.encoder.get_submodule(parent_name)
        linear = getattr(parent, child)
        w_max = linear.weight.abs().amax(0).clamp(min=1e-5)
        scale = (x_max.clamp(min=1e-5) ** alpha / w_max ** (1 - alpha)).clamp(min=1e-5)
        setattr(parent, child, Smoothed(linear, scale))


def session(path: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_runner(path: str, threads: int):
    """The export at `path` as a function of (input ids, attention mask) -> hidden states."""
    s = session(path, threads)
    return lambda ids, mask: s.run(None, dict(zip(INPUT_NAMES, (ids, mask), strict=True)))[0]


def sentence_vectors(run, tokenizer, texts: list[str]) -> tuple[np.ndarray, list[float]]:
    """Mean-pooled unit vectors of each text alone, and each pass's seconds."""
    vectors, seconds = [], []
    for text in texts:
        feed = tokenizer([text], return_tensors="np")
        ids, mask = feed["input_ids"].astype(np.int64), feed["attention_mask"].astype(np.int64)
        started = time.perf_counter()
        hidden = run(ids, mask)
        seconds.append(time.perf_counter() - started)
        v = (hidden * mask[..., None]).sum(1)[0] / mask.sum()
        vectors.append(v / np.linalg.norm(v))
    return np.array(vectors), seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.5, 0.75, 0.9])
    args = parser.parse_args()
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process the graph
    directory = embedding_model(MPNET).default_directory()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    questions = sorted(
        {t for r in load_rows() if r["split"] == "tune" for t in (r["a"], r["b"]) if isinstance(t, str)}
    )
    random.Random(0).shuffle(questions)
    calibration, compared = questions[:CALIBRATION], questions[CALIBRATION : CALIBRATION + COMPARED]
    reference = AutoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        ref, _ = sentence_vectors(
            lambda ids, mask: reference(
                input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
            ).last_hidden_state.numpy(),
            tokenizer,
            compared,
        )
    ranges = input_ranges(reference, tokenizer, calibration)
    print(f"all-mpnet-base-v2, {COMPARED} tuning questions, vectors against float32 (torch)")
    print("| alpha | int8 weights | cosine mean / min | 1 thread p50 / p99 ms | 2 threads p50 / p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for alpha in args.alphas:
            model = AutoModel.from_pretrained(directory).eval()
            if alpha > 0:
                smooth(model, ranges, alpha)
            plain = os.path.join(tmp, f"alpha{alpha}.onnx")
            export(model, tokenizer, plain)
            for per_channel in (False, True):
                quantized = plain.replace(".onnx", f"-int8-{int(per_channel)}.onnx")
                quantize_dynamic(
                    plain,
                    quantized,
                    weight_type=QuantType.QInt8,
                    per_channel=per_channel,
                    op_types_to_quantize=["MatMul"],
                )
                timings = []
                for threads in (1, 2):
                    vectors, seconds = sentence_vectors(ort_runner(quantized, threads), tokenizer, compared)
                    timings.append(f"{np.median(seconds) * 1e3:.1f} / {np.percentile(seconds, 99) * 1e3:.1f}")
                cosines = (vectors * ref).sum(1)
                print(
                    f"| {alpha:g} | {'per output channel' if per_channel else 'per tensor'} | "
                    f"{cosines.mean():.4f} / {cosines.min():.4f} | {timings[0]} | {timings[1]} |"
                )
            if alpha == 0:
                _, seconds = sentence_vectors(ort_runner(plain, 1), tokenizer, compared)
                print(
                    f"| float32 (ONNX Runtime) | - | 1 / 1 | {np.median(seconds) * 1e3:.1f} / "
                    f"{np.percentile(seconds, 99) * 1e3:.1f} | - |"
                )


if __name__ == "__main__":
    main()
