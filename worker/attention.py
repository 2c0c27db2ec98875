"""Paged attention over one flat batch of tokens from many sequences.

K/V live in one preallocated pool per layer, shaped [num_blocks, block_size, num_kv_heads, head_dim].
Each token's K/V is written to its slot (block_id * block_size + offset). Reading gathers a
sequence's blocks through its block table; there is no per-sequence contiguous cache.

Decode tokens (one query per sequence) are attended together in one padded batch; prefill chunks
run one sequence at a time with a causal mask offset by the tokens already in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    token_start: int  # index in the flat batch
    num_tokens: int
    context_len: int  # tokens in the cache after this chunk (start position + num_tokens)
    block_table: torch.Tensor  # [num_blocks_for_context] long


@dataclass
class AttentionMetadata:
    """What attention needs for one step; built once by the runner, shared by every layer."""

    slot_mapping: torch.Tensor  # [num_tokens] long
    decode_token_indices: torch.Tensor | None  # [num_decodes] long, positions in the flat batch
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] long (padded with 0)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_blocks * block_size] bool
    prefills: list[PrefillChunk]
    decode_contiguous: bool = False  # decode tokens are exactly the first num_decodes tokens


def write_kv(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, values)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks] block ids -> [B, num_kv_heads, max_blocks * block_size, head_dim]."""
    num_seqs, max_blocks = block_tables.shape
    blocks = cache.index_select(0, block_tables.reshape(-1))
    blocks = blocks.view(num_seqs, max_blocks * cache.shape[1], cache.shape[2], cache.shape[3])
    return blocks.transpose(1, 2)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KV, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    write_kv(k_cache, meta.slot_mapping, k)
    write_kv(v_cache, meta.slot_mapping, v)
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    if meta.decode_token_indices is not None:
        _decode(q, k_cache, v_cache, meta, out, num_heads // num_kv_heads)
    for chunk in meta.prefills:
        _prefill(q, k, v, k_cache, v_cache, chunk, out, num_heads // num_kv_heads)
    return out


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, out, group: int) -> None:  # noqa: ANN001
    idx = meta.decode_token_indices
    num = idx.shape[0]
    q_dec = q[:num] if meta.decode_contiguous else q.index_select(0, idx)
    # Grouped-query trick: the `group` query heads that share one KV head become that head's
    # query rows, so no K/V is repeated: [B, KV, group, D] against [B, KV, L, D].
    q_dec = q_dec.view(num, -1, group, q.shape[-1])
    keys = gather_kv(k_cache, meta.decode_block_tables)
    values = gather_kv(v_cache, meta.decode_block_tables)
    attn = F.scaled_dot_product_attention(q_dec, keys, values, attn_mask=meta.decode_mask)
    attn = attn.reshape(num, -1, q.shape[-1])
    if meta.decode_contiguous:
        out[:num] = attn
    else:
        out.index_copy_(0, idx, attn)


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, out, group: int) -> None:  # noqa: ANN001
    s, n = chunk.token_start, chunk.num_tokens
    q_seq = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    if chunk.context_len == n:
        # Nothing earlier in the cache: attend to this chunk's own K/V, plain causal.
        keys = k[s : s + n].transpose(0, 1).unsqueeze(0)
        values = v[s : s + n].transpose(0, 1).unsqueeze(0)
        attn = F.scaled_dot_product_attention(q_seq, keys, values, is_causal=True, enable_gqa=group > 1)
    else:
        keys = gather_kv(k_cache, chunk.block_table.unsqueeze(0))[:, :, : chunk.context_len]
        values = gather_kv(v_cache, chunk.block_table.unsqueeze(0))[:, :, : chunk.context_len]
        offset = chunk.context_len - n
        rows = torch.arange(n, device=q.device).unsqueeze(1) + offset
        cols = torch.arange(chunk.context_len, device=q.device).unsqueeze(0)
        mask = cols <= rows
        attn = F.scaled_dot_product_attention(q_seq, keys, values, attn_mask=mask, enable_gqa=group > 1)
    out[s : s + n] = attn.squeeze(0).transpose(0, 1)
