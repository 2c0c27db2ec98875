"""Paged attention over one flat batch of tokens from many sequences.

K/V live in one preallocated pool per layer, shaped [num_kv_heads, num_blocks, block_size, head_dim].
Each token's K/V is written to its slot (block_id * block_size + offset). Reading gathers a
sequence's blocks through its block table; there is no per-sequence contiguous cache.

    pool (one KV head):  [blk0: s0..s15][blk1: s16..s31][blk2 ...] ...
    seq A block table:   [7, 2, 11]  ->  gather blocks 7, 2, 11 -> A's keys, in order

The KV head is the outer dimension so that a gather for a batch of sequences comes out as
[KV, B, L, D], contiguous: attention for all decodes is then two plain batched matmuls with
no copy of the gathered keys.

Decode tokens (one query per sequence) are attended together: by the native kernel
(`worker/kernels/paged_attention.cpp`), which reads each block in place, or, on the "torch" backend
(CUDA, or a CPU build without the kernel), in one padded batch over gathered blocks. Prefill chunks run
one sequence at a time through SDPA with a causal mask offset by the tokens already in the cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from worker.engine.config import ATTENTION_BACKENDS
from worker.kernels import native_op, native_ops

# Up to this many tokens, a chunk after cached context runs its grouped query heads as rows of one head (CPU):
# SDPA's CPU kernel took 145 against 223 us for 40 tokens over 552 (bfloat16, 9 heads over 3, AMX Xeon, 2
# threads), about the same at 128 tokens and slower at 256.
GROUPED_ROWS_MAX_TOKENS = 64
# A bfloat16 chunk of head size 64 on a CPU with AMX or AVX512-BF16 runs the native kernel over the pool
# (every chunk of a step in one call, worker/kernels/prefill_attention.cpp) instead of a gathered copy and
# SDPA.
# Per layer, against the torch path (AMX Xeon, 2 threads, 9 heads over 3): 8 chunks of 32 over a shared
# 512-token prefix 0.95 -> 0.34 ms; one chunk of 128 fresh 0.14 -> 0.08, of 512 over 1536 4.3 -> 2.0, over
# 4096 9.6 -> 4.6, 2048 over 2048 34 -> 14: no length where SDPA is faster, so no limit. Without AMX
# (AVX512-BF16 EPYC, 2 threads): 40 tokens over 530 0.48 -> 0.11 ms, 128 fresh 0.36 -> 0.08, 512 fresh 3.9
# -> 0.57, 512 over 1536 18.5 -> 3.3, over 4096 36.0 -> 7.8.


@dataclass
class PrefillChunk:
    token_start: int  # index in the flat batch
    num_tokens: int
    context_len: int  # tokens in the cache after this chunk (start position + num_tokens)
    block_table: torch.Tensor  # [num_blocks_for_context] long
    _masks: dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def bias(
        self, window: int | None, dtype: torch.dtype, device: torch.device, repeat: int = 1
    ) -> torch.Tensor:
        """[num_tokens, context_len] additive attention mask, 0 where a query sees a key and -inf where it
        does not: causal from the chunk's place in the context (and within the window). Built once per step,
        not once per layer, and already in the scores' form (a bool mask is converted on every call).
        `repeat` stacks it that many times, for query heads taken as rows of one head."""
        if repeat > 1:
            stacked = self._masks.get((window, dtype, device, repeat))
            if stacked is None:
                stacked = self.bias(window, dtype, device).repeat(repeat, 1)
                self._masks[(window, dtype, device, repeat)] = stacked
            return stacked
        mask = self._masks.get((window, dtype, device))
        if mask is None:
            n = self.num_tokens
            rows = torch.arange(n, device=device).unsqueeze(1) + (self.context_len - n)
            cols = torch.arange(self.context_len, device=device).unsqueeze(0)
            visible = cols <= rows
            if window is not None:
                visible &= cols > rows - window
            mask = torch.zeros(visible.shape, dtype=dtype, device=device)
            mask.masked_fill_(~visible, float("-inf"))
            self._masks[(window, dtype, device)] = mask
        return mask


@dataclass
class NativePrefillBatch:
    """A step's chunks as the native prefill kernel reads them."""

    chunks: torch.Tensor  # [C, 3] long: first token in the batch, tokens, context length after the chunk
    block_tables: torch.Tensor  # [C, width] long, padded with block 0

    @staticmethod
    def of(chunks: list[PrefillChunk]) -> NativePrefillBatch:
        width = max(len(c.block_table) for c in chunks)
        tables = torch.zeros(len(chunks), width, dtype=torch.long)
        for i, c in enumerate(chunks):
            tables[i, : len(c.block_table)] = c.block_table
        rows = [[c.token_start, c.num_tokens, c.context_len] for c in chunks]
        return NativePrefillBatch(torch.tensor(rows, dtype=torch.long), tables)


@dataclass
class AttentionMetadata:
    """What attention needs for one step; built once by the runner, shared by every layer."""

    slot_mapping: torch.Tensor  # [num_tokens] long
    num_decodes: int  # decode tokens are the first num_decodes tokens of the batch
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] long (padded with 0)
    decode_mask: (
        torch.Tensor | None
    )  # torch backend: [1, num_decodes, 1, max_blocks * bs] bool, True = masked
    prefills: list[PrefillChunk]
    decode_context_lens: torch.Tensor | None = None  # [num_decodes] long
    native_decode: bool = False  # decode through the native kernel (else the gather path)
    native_prefill: bool = (
        False  # prefill chunks may take the native kernel where it applies (the native backend)
    )
    _window_masks: dict[int, torch.Tensor] | None = None
    _native_batch: NativePrefillBatch | None = None

    def native_prefill_batch(self) -> NativePrefillBatch:
        """The step's chunks as the native prefill kernel reads them, built once per step."""
        if self._native_batch is None:
            self._native_batch = NativePrefillBatch.of(self.prefills)
        return self._native_batch

    def decode_window_mask(self, window: int) -> torch.Tensor:
        """The torch decode mask for a sliding-window layer: also masks keys at or before ctx - 1 - window
        (built once per step for each window size)."""
        if self._window_masks is None:
            self._window_masks = {}
        if window not in self._window_masks:
            span = torch.arange(self.decode_mask.shape[-1], device=self.decode_mask.device)
            old = span.unsqueeze(0) <= (self.decode_context_lens - 1 - window).unsqueeze(1)
            self._window_masks[window] = self.decode_mask | old.view(self.decode_mask.shape)
        return self._window_masks[window]


def resolve_attention_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """ "native" where the compiled kernel can run (CPU, float32/bfloat16), else "torch"."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {ATTENTION_BACKENDS}")
    native_ok = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
    if backend == "auto":
        return "native" if native_ok and native_ops() is not None else "torch"
    if backend == "native":
        if not native_ok:
            raise ValueError(
                f"the native attention kernel runs on CPU in float32/bfloat16, not {dtype} on {device}"
            )
        if native_ops() is None:
            raise ValueError("the native kernels are not built: run `make kernels`")
    return backend


def write_kv(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """values [T, KV, D] into their slots of cache [KV, num_blocks, bs, D]."""
    cache.view(cache.shape[0], -1, cache.shape[-1]).index_copy_(1, slot_mapping, values.transpose(0, 1))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks] block ids -> [KV, B, max_blocks * block_size, D], contiguous."""
    num_seqs, max_blocks = block_tables.shape
    blocks = cache.index_select(1, block_tables.reshape(-1))
    return blocks.view(cache.shape[0], num_seqs, max_blocks * cache.shape[2], cache.shape[3])


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KV, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    window: int | None = None,  # sliding window: a query at position p sees keys at (p - window, p] only
) -> torch.Tensor:
    writer = native_op("write_kv") if k_cache.device.type == "cpu" else None
    rows_contiguous = all(x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] for x in (k, v))
    if writer is not None and rows_contiguous and meta.slot_mapping.dtype == torch.long:
        # one call for both caches: two index_copy_ calls a layer were ~10 us each, 3 ms of a 64-row step
        writer.write_kv(k, v, meta.slot_mapping, k_cache, v_cache)
    else:
        write_kv(k_cache, meta.slot_mapping, k)
        write_kv(v_cache, meta.slot_mapping, v)
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    if meta.num_decodes and meta.native_decode:
        if window is not None:
            raise ValueError(
                "the native decode kernel has no sliding window: use the torch attention backend"
            )
        native_ops().decode_attention(
            q[: meta.num_decodes].contiguous(),
            k_cache,
            v_cache,
            meta.decode_block_tables,
            meta.decode_context_lens,
            q.shape[-1] ** -0.5,
            out[: meta.num_decodes],
        )
    elif meta.num_decodes:
        mask = meta.decode_mask if window is None else meta.decode_window_mask(window)
        out[: meta.num_decodes] = _decode(q[: meta.num_decodes], k_cache, v_cache, mask, meta, group)
    if meta.native_prefill and meta.prefills and _native_prefill_applies(q, k_cache, window):
        batch = meta.native_prefill_batch()  # every chunk in one call, a shared prefix laid out once
        _native_prefill().prefill_attention(
            q, k_cache, v_cache, batch.block_tables, batch.chunks, q.shape[-1] ** -0.5, out
        )
        return out
    for chunk in meta.prefills:
        _prefill(q, k, v, k_cache, v_cache, chunk, out, group, window)
    return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    mask: torch.Tensor,
    meta: AttentionMetadata,
    group: int,
) -> torch.Tensor:
    num, num_heads, head_dim = q.shape
    num_kv = num_heads // group
    # Grouped-query trick: the `group` query heads sharing one KV head become that head's query rows,
    # so no K/V is repeated: [KV, B, group, D] against [KV, B, L, D].
    q_grouped = q.view(num, num_kv, group, head_dim).transpose(0, 1)
    keys = gather_kv(k_cache, meta.decode_block_tables)
    values = gather_kv(v_cache, meta.decode_block_tables)
    scores = torch.matmul(q_grouped, keys.transpose(-1, -2)) * (head_dim**-0.5)
    probs = scores.float().masked_fill_(mask, float("-inf")).softmax(dim=-1).to(q.dtype)
    attn = torch.matmul(probs, values)  # [KV, B, group, D]
    return attn.transpose(0, 1).reshape(num, num_heads, head_dim)


@functools.cache
def _native_prefill() -> object | None:
    """The native prefill-attention kernel where this build runs it (AMX or AVX512-BF16), else None."""
    ops = native_op("prefill_attention")
    return ops if ops is not None and ops.prefill_attention_supported() else None


def _native_prefill_applies(q: torch.Tensor, k_cache: torch.Tensor, window: int | None) -> bool:
    return (
        window is None
        and q.device.type == "cpu"
        and q.dtype == torch.bfloat16
        and q.shape[-1] == 64
        and q.stride(-1) == 1
        and q.stride(-2) == 64
        and k_cache.shape[2] % 16 == 0
        and _native_prefill() is not None
    )


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, out, group: int, window: int | None) -> None:
    s, n = chunk.token_start, chunk.num_tokens
    q_seq = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    fresh = chunk.context_len == n  # nothing earlier in the cache: this chunk's own K/V is all there is
    if fresh:
        keys = k[s : s + n].transpose(0, 1).unsqueeze(0)
        values = v[s : s + n].transpose(0, 1).unsqueeze(0)
    else:
        table = chunk.block_table.unsqueeze(0)
        keys = gather_kv(k_cache, table)[:, :, : chunk.context_len].transpose(0, 1)  # [1, KV, L, D]
        values = gather_kv(v_cache, table)[:, :, : chunk.context_len].transpose(0, 1)
    if fresh and window is None:
        attn = F.scaled_dot_product_attention(q_seq, keys, values, is_causal=True, enable_gqa=group > 1)
    elif group > 1 and n <= GROUPED_ROWS_MAX_TOKENS and q.device.type == "cpu":
        # The query heads sharing a KV head as one head's rows (the mask repeated per head): the same
        # products, but SDPA's CPU kernel gets a taller query block instead of a grouped one.
        bias = chunk.bias(window, q.dtype, q.device, repeat=group)
        rows = q_seq.reshape(1, q_seq.shape[1] // group, group * n, q_seq.shape[-1])
        attn = F.scaled_dot_product_attention(rows, keys, values, attn_mask=bias).reshape(q_seq.shape)
    else:
        bias = chunk.bias(window, q.dtype, q.device)
        attn = F.scaled_dot_product_attention(q_seq, keys, values, attn_mask=bias, enable_gqa=group > 1)
    out[s : s + n] = attn.squeeze(0).transpose(0, 1)
