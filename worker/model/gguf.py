"""4-bit weights straight from a GGUF file's Q4_0/Q4_1 blocks, keyed by Hugging Face parameter name.

The engine's float weights are a de-quantization of the same file (`make model`), so the 4-bit blocks
are exactly what those floats were made from: loading them as `Int4Groups` gives int4 weights with no
second rounding. Every tensor is checked against the float weight it claims to be (same values after
de-quantization), so a naming or row-order mismatch falls back to quantizing from float instead of
serving wrong weights.

llama.cpp stores attn_q/attn_k rows permuted for its rotary layout; the permutation moves whole rows
(output features), never the 32-weight blocks along a row, so it is undone on the block rows.
"""

from __future__ import annotations

import glob
import logging
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np
import torch

from worker.model.quant import INT4_GROUP_SIZE, Int4Groups

log = logging.getLogger(__name__)

# Hugging Face name inside a layer -> GGUF name inside blk.N
LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


# GGUF's scalar value types (id -> size in bytes); 8 is a string, 9 an array
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
GGML_TYPES = {2: "Q4_0", 3: "Q4_1"}  # the block types loaded here
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


@dataclass
class GGUFTensor:
    name: str
    kind: str  # "Q4_0", "Q4_1", or "other"
    shape: tuple[int, ...]  # [rows, columns] as torch sees it
    data: memoryview  # the raw blocks (for the 4-bit kinds)


def read_gguf_tensors(path: str) -> dict[str, GGUFTensor]:
    """The tensor directory of a GGUF file, over one read-only mmap.

    gguf.GGUFReader builds a numpy view for every element of the metadata arrays (the 49k-token
    vocabulary, the merges), which takes over a minute here; this walks past the metadata instead.
    """
    with open(path, "rb") as f:
        buf = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    magic, version, num_tensors, num_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{path} is not a GGUF v2+ file")
    offset, alignment = 24, 32
    for _ in range(num_kv):
        key, offset = _read_string(buf, offset)
        (value_type,) = struct.unpack_from("<I", buf, offset)
        if key == "general.alignment" and value_type == _UINT32:
            (alignment,) = struct.unpack_from("<I", buf, offset + 4)
        offset = _skip_value(buf, offset + 4, value_type)
    infos = []
    for _ in range(num_tensors):
        name, offset = _read_string(buf, offset)
        (num_dims,) = struct.unpack_from("<I", buf, offset)
        dims = struct.unpack_from(f"<{num_dims}Q", buf, offset + 4)
        offset += 4 + 8 * num_dims
        type_id, data_offset = struct.unpack_from("<IQ", buf, offset)
        offset += 12
        infos.append((name, GGML_TYPES.get(type_id, "other"), tuple(reversed(dims)), data_offset))
    start = (offset + alignment - 1) // alignment * alignment
    tensors = {}
    for name, kind, shape, data_offset in infos:
        size = shape[0] * (shape[-1] // INT4_GROUP_SIZE) * _BLOCK_BYTES[kind] if kind in _BLOCK_BYTES else 0
        tensors[name] = GGUFTensor(name, kind, shape, buf[start + data_offset : start + data_offset + size])
    return tensors


def _read_string(buf: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, offset)
    return bytes(buf[offset + 8 : offset + 8 + length]).decode("utf-8", "replace"), offset + 8 + length


def _skip_value(buf: memoryview, offset: int, value_type: int) -> int:
    if value_type == _STRING:
        (length,) = struct.unpack_from("<Q", buf, offset)
        return offset + 8 + length
    if value_type == _ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, offset)
        offset += 12
        if item_type in _SCALAR_SIZES:
            return offset + count * _SCALAR_SIZES[item_type]
        for _ in range(count):
            offset = _skip_value(buf, offset, item_type)
        return offset
    return offset + _SCALAR_SIZES[value_type]


def find_gguf(model_dir: str) -> str | None:
    """The GGUF file kept beside a model directory's safetensors (tools/fetch_model.py), if any."""
    files = sorted(glob.glob(os.path.join(model_dir, "*.gguf")))
    return files[0] if files else None


def decode_q4_blocks(raw: np.ndarray, kind: str) -> Int4Groups:
    """Q4_1 rows (d, m: float16; 16 bytes of nibbles) or Q4_0 rows (d; nibbles) -> Int4Groups.

    Within a block, byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
    """
    header = 4 if kind == "Q4_1" else 2
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, header + INT4_GROUP_SIZE // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else None
    nibbles = blocks[..., header:]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)
    scales = torch.from_numpy(d)
    # Q4_1: w = d q + m, Int4Groups' own form;  Q4_0: w = d (q - 8) = d q - 8 d (8 d is exact in float32)
    mins = torch.from_numpy(m) if m is not None else -8 * scales
    return Int4Groups(torch.from_numpy(np.ascontiguousarray(codes)), scales, mins, INT4_GROUP_SIZE)


def undo_rotary_permutation(groups: Int4Groups, num_heads: int) -> Int4Groups:
    """Reorder rows the way transformers un-permutes llama.cpp's attn_q/attn_k on load."""
    rows = groups.codes.shape[0]
    half = rows // num_heads // 2
    order = torch.arange(rows).reshape(num_heads, half, 2).transpose(1, 2).reshape(rows)
    return Int4Groups(groups.codes[order], groups.scales[order], groups.mins[order], groups.group_size)


def load_int4_groups(
    gguf_path: str, float_weights: dict[str, torch.Tensor], num_heads: int, num_kv_heads: int
) -> dict[str, Int4Groups]:
    """Int4Groups for every layer weight whose GGUF tensor is Q4_0/Q4_1 and matches its float copy."""
    tensors = read_gguf_tensors(gguf_path)
    found: dict[str, Int4Groups] = {}
    mismatched = []
    for hf_name, weight in float_weights.items():
        gguf_name = _gguf_name(hf_name)
        tensor = tensors.get(gguf_name) if gguf_name else None
        if tensor is None or tensor.kind not in _BLOCK_BYTES or tensor.shape != tuple(weight.shape):
            continue
        raw = np.frombuffer(tensor.data, dtype=np.uint8).reshape(tensor.shape[0], -1)
        groups = decode_q4_blocks(raw, tensor.kind)
        if gguf_name.endswith("attn_q.weight"):
            groups = undo_rotary_permutation(groups, num_heads)
        elif gguf_name.endswith("attn_k.weight"):
            groups = undo_rotary_permutation(groups, num_kv_heads)
        if not _same_weights(groups, weight):
            mismatched.append(gguf_name)
            continue
        found[hf_name] = groups
    if mismatched:
        log.warning("%d tensors of %s differ from the float weights (first: %s); they are re-quantized",
                    len(mismatched), gguf_path, mismatched[0])  # fmt: skip
    return found


def _gguf_name(hf_name: str) -> str | None:
    parts = hf_name.split(".")  # model.layers.N.<rest>
    if len(parts) < 4 or parts[:2] != ["model", "layers"]:
        return None
    return f"blk.{parts[2]}.{LAYER_TENSORS.get('.'.join(parts[3:]), '?')}"


def _same_weights(groups: Int4Groups, weight: torch.Tensor, row_stride: int = 16) -> bool:
    """De-quantized blocks equal the float weights, up to the rounding of the weights' own dtype (a
    bfloat16 model holds them to 8 bits) and float32's rounding of d q + m (the conversion may have
    computed it in another order or precision).

    Every 16th row is compared: a wrong tensor or row order shows in any of them, at 1/16 of the cost.
    """
    rows = slice(0, None, row_stride)
    sample = Int4Groups(groups.codes[rows], groups.scales[rows], groups.mins[rows], groups.group_size)
    reference = weight.detach()[rows].float()
    dequantized = sample.dequantize()
    tolerance = torch.finfo(weight.dtype).eps * dequantized.abs() + 1e-3 * sample.scales.abs().max() + 1e-6
    return bool(((dequantized - reference).abs() <= tolerance).all())
