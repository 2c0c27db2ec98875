"""Decode steps replayed from CUDA graphs.

A decode step of a small model on a GPU is bound by the host, not the GPU: the forward launches about
fifty kernels per layer and the GPU runs them faster than Python issues them (docs/STUDY_LOG.md). Capturing
the forward once per shape and replaying it issues all of those kernels with one call, as vLLM does.

A graph replays fixed shapes at fixed addresses, so decode inputs go through static buffers and shapes
are bucketed: the batch is padded to the next batch bucket (padding rows write their K/V into a scratch
block that the block manager never hands out, and their logits are dropped), and the block tables to
the next power of two of blocks (blocks past a sequence's length are masked, as the eager path masks
them). Each (batch, blocks) bucket is captured the first time a step needs it, all into one memory pool:
graphs never run at once, so they can share their intermediates.

`capture=False` runs the very same padded path eagerly: the CPU tests check it against the eager
forward, so the GPU only adds the capture itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from worker.model.attention import AttentionMetadata

log = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


def block_buckets(max_blocks: int) -> list[int]:
    """Powers of two up to max_blocks (and max_blocks itself): at most twice the blocks a step needs."""
    sizes, b = [], 1
    while b < max_blocks:
        sizes.append(b)
        b *= 2
    return sizes + [max_blocks]


def bucket(value: int, sizes: Sequence[int]) -> int:
    return next(s for s in sizes if s >= value)


class DecodeGraphs:
    """Static-shape decode over the paged KV cache, captured as CUDA graphs (or run eagerly)."""

    def __init__(
        self,
        model,  # LlamaForPagedAttention
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        scratch_block: int,
        max_batch: int,
        max_blocks: int,
        capture: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.capture = capture
        self.batch_sizes = batch_buckets(max_batch)
        self.block_counts = block_buckets(max_blocks)
        device = model.embed.device
        long = {"dtype": torch.long, "device": device}
        self.input_ids = torch.zeros(max_batch, **long)
        self.positions = torch.zeros(max_batch, **long)
        self.slot_mapping = torch.zeros(max_batch, **long)
        self.context_lens = torch.ones(max_batch, **long)
        self.block_tables = torch.full((max_batch, max_blocks), scratch_block, **long)
        self.logits = torch.empty(max_batch, model.shape.vocab_size, dtype=model.embed.dtype, device=device)
        pinned = device.type == "cuda"
        self._staging = torch.empty((4, max_batch), dtype=torch.long, pin_memory=pinned)
        self._staging_tables = torch.empty((max_batch, max_blocks), dtype=torch.long, pin_memory=pinned)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    # ---- one step ------------------------------------------------------------------------
    def run(
        self, token_ids: list[int], positions: list[int], block_ids: list[list[int]]
    ) -> torch.Tensor | None:
        """Logits [num_seqs, vocab] of one decode token per sequence (a view of a buffer that the next
        step overwrites: sample from it before the next call); None when the step is larger than the
        largest bucket (more sequences, or a longer context), for the general path to run."""
        n, bs = len(token_ids), self.block_size
        needed = max(positions) // bs + 1
        if n > self.batch_sizes[-1] or needed > self.block_counts[-1]:
            return None
        shape = (bucket(n, self.batch_sizes), bucket(needed, self.block_counts))
        self._load(token_ids, positions, block_ids, *shape)
        if not self.capture:
            self._forward(*shape)
        else:
            graph = self.graphs.get(shape)
            if graph is None:
                graph = self.graphs[shape] = self._capture(*shape)
            graph.replay()
        return self.logits[:n]

    def _load(self, token_ids, positions, block_ids, batch: int, blocks: int) -> None:
        n, bs, scratch = len(token_ids), self.block_size, self.scratch_block
        pad = batch - n
        staged = self._staging[:, :batch]
        staged[0] = torch.tensor(token_ids + [0] * pad)
        staged[1] = torch.tensor(positions + [0] * pad)
        slots = [ids[p // bs] * bs + p % bs for ids, p in zip(block_ids, positions, strict=True)]
        staged[2] = torch.tensor(slots + [scratch * bs] * pad)
        staged[3] = torch.tensor([p + 1 for p in positions] + [1] * pad)
        rows = [ids[:blocks] + [scratch] * (blocks - len(ids)) for ids in block_ids]
        tables = self._staging_tables[:batch, :blocks]
        tables.copy_(torch.tensor(rows + [[scratch] * blocks] * pad, dtype=torch.long).view(batch, blocks))
        self.input_ids[:batch].copy_(staged[0], non_blocking=True)
        self.positions[:batch].copy_(staged[1], non_blocking=True)
        self.slot_mapping[:batch].copy_(staged[2], non_blocking=True)
        self.context_lens[:batch].copy_(staged[3], non_blocking=True)
        self.block_tables[:batch, :blocks].copy_(tables, non_blocking=True)

    def _forward(self, batch: int, blocks: int) -> None:
        """The decode forward over the static buffers: what a graph of this shape captures."""
        span = torch.arange(blocks * self.block_size, device=self.context_lens.device)
        context_lens = self.context_lens[:batch]
        mask = span.unsqueeze(0) >= context_lens.unsqueeze(1)
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch],
            num_decodes=batch,
            decode_block_tables=self.block_tables[:batch, :blocks],
            decode_mask=mask.view(1, batch, 1, -1),
            prefills=[],
            decode_context_lens=context_lens,
        )
        logits = self.model.forward(
            self.input_ids[:batch], self.positions[:batch], meta, self.kv_caches, None
        )
        self.logits[:batch].copy_(logits)

    def _capture(self, batch: int, blocks: int) -> torch.cuda.CUDAGraph:
        # Warm-up on a side stream first (lazy initialisation must not happen inside the capture); it
        # computes this step's real K/V and logits, which the replay then writes again, identically.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(batch, blocks)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._forward(batch, blocks)
        log.info("captured the decode graph for %d sequences x %d blocks", batch, blocks)
        return graph
