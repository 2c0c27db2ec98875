"""tools/fetch_model.py without the network: a GGUF file shipped whole, or split over several packages; its
conversion parsing the file once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tools.fetch_model import MODELS, find_or_assemble_gguf, gguf_parsed_once


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_whole_file_is_taken_as_it_is(tmp_path: Path) -> None:
    write(tmp_path / "pkg" / "model.Q4_1.gguf", b"GGUF")
    assert find_or_assemble_gguf(str(tmp_path)) == str(tmp_path / "pkg" / "model.Q4_1.gguf")


@pytest.mark.parametrize("good_sum", [True, False])
def test_parts_from_several_packages_are_joined_in_order_and_checked(tmp_path: Path, good_sum: bool) -> None:
    chunks = [b"GGUF-head-", b"middle-", b"tail"]
    for i, chunk in reversed(list(enumerate(chunks))):  # unpacked in any order
        write(tmp_path / f"pkg_part{i + 1}" / "data" / f"m.gguf.part{i:02d}", chunk)
    digest = hashlib.sha256(b"".join(chunks)).hexdigest() if good_sum else "0" * 64
    write(tmp_path / "pkg" / "data" / "SHA256SUMS", f"{digest}  m.gguf\n".encode())
    if not good_sum:
        with pytest.raises(ValueError, match="sha256"):
            find_or_assemble_gguf(str(tmp_path))
        return
    joined = Path(find_or_assemble_gguf(str(tmp_path)))
    assert joined.name == "m.gguf" and joined.read_bytes() == b"".join(chunks)


def test_nothing_to_find(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        find_or_assemble_gguf(str(tmp_path))


def test_every_model_pins_its_packages() -> None:
    assert all(p.count("==") == 1 for packages in MODELS.values() for p in packages)


def test_the_conversion_parses_a_gguf_file_once_and_puts_gguf_back(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(path)) is first and first.tensors[0].name == "token_embd.weight"
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    assert gguf.GGUFReader(str(path)) is not first
