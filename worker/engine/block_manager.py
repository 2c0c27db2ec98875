"""Paged KV block bookkeeping with automatic prefix caching. Pure Python: no torch, no model.

The KV pool holds `num_blocks` blocks of `block_size` token slots. A request owns a block table
(list of block ids); token i of the request lives in slot block_table[i // bs] * bs + i % bs.

    request tokens:  [t0 .. t15][t16 .. t31][t32 .. t37 ______]
    block table:     [    7    ][    2     ][      11         ]   (last block partly filled)

A *full* block is identified by a hash chained from its predecessor's hash and its own tokens, so one
hash names a whole prefix. Full blocks are registered in `cached_blocks` once computed; a later
request whose prompt starts with the same tokens reuses them (reference counted). A block whose
count drops to zero goes to the back of the free queue but keeps its hash: until it is handed out
again it can still be hit. Allocation takes from the front, so the least recently freed block is
evicted first.

A request's next block is the one after its last whenever that one is free, so that a sequence's blocks lie
side by side in the pool, where a decode step's attention reads them as one stream (docs/STUDY_LOG.md: 64
sequences of ~195 tokens, blocks scattered 23.8 ms a step, side by side 19.3). Where that block holds a cached
prefix, its contents move into the block LRU order would have handed out, which takes its place in the
order: the cache keeps exactly what LRU eviction keeps. The move is a block copy the runner makes before the
step (`take_copies`, SchedulerOutput.block_copies). The fresh blocks of one allocation go into the table in
ascending order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from worker.engine.request import Request


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()  # kept for the token re-check on a hash hit


def hash_block(parent_hash: int | tuple | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def chain_seed(request: Request) -> tuple | None:
    """The first block's parent: None for the base model, the adapter's id for a LoRA request, so the K/V of
    one adapter (or of the base model) is never hit by another."""
    return ("lora", request.lora_id) if request.lora_id else None


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        move_cached_blocks: bool = True,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Whether a cached block wanted as a sequence's next block moves (a block copy) or stays put: off on
        # CUDA, where attention reads a sequence's blocks in parallel wherever they lie (not measured there).
        self.move_cached_blocks = move_cached_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # LRU order of the free blocks: entry -> block id, and each free block's entry. An entry keeps its
        # place while the block under it changes (a cached block moved into another, `_pop_free`).
        self.free_queue: OrderedDict[int, int] = OrderedDict((i, i) for i in range(num_blocks))
        self._entry_of: dict[int, int] = {i: i for i in range(num_blocks)}
        self._next_entry = num_blocks
        self._copies: list[tuple[int, int]] = []  # (from, to) block moves the runner has not made yet
        self.cached_blocks: dict[int, int] = {}  # block hash -> block id
        # Per request: hashes of its full blocks that are registered in the cache, in order.
        self._request_hashes: dict[str, list[int]] = {}
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by live requests (cached-but-free blocks do not count)."""
        return self.num_blocks - len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache --------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix of the prompt, never covering its last token.

        The last prompt token must run to produce logits, so at most (num_tokens - 1) tokens count.
        Every hash hit is re-checked against the block's stored tokens.
        """
        if not self.enable_prefix_caching:
            return []
        max_full = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash, chunk in self._chain(request, max_full):
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            hits.append(block_id)
        return hits

    def chain_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The chained hashes of the request's first `num_blocks` full blocks, cached or not."""
        return [block_hash for block_hash, _ in self._chain(request, num_blocks)]

    def _chain(self, request: Request, num_blocks: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        """(chained hash, tokens) of the request's first `num_blocks` full blocks, lazily."""
        parent = chain_seed(request)
        tokens = request.all_token_ids
        for i in range(num_blocks):
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            parent = hash_block(parent, chunk)
            yield parent, chunk

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_query_tokens
        self.prefix_hits += num_hit_tokens

    # ---- allocation ----------------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] = ()) -> bool:
        computed = request.num_computed_tokens
        if cached_block_ids:
            computed = len(cached_block_ids) * self.block_size
        needed = (
            self.blocks_needed(computed + num_new_tokens) - len(request.block_ids) - len(cached_block_ids)
        )
        # Reusing a cached block that is currently free takes it out of the free queue too.
        free_hits = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0)
        return max(needed, 0) + free_hits <= self.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] = ()) -> bool:
        """Grow the request's block table to hold num_new_tokens more tokens. False if out of blocks."""
        if not self.can_allocate(request, num_new_tokens, cached_block_ids):
            return False
        for block_id in cached_block_ids:
            self._take(block_id)
            request.block_ids.append(block_id)
        if cached_block_ids:
            self._request_hashes[request.request_id] = [self.blocks[b].block_hash for b in cached_block_ids]
            request.num_computed_tokens = len(cached_block_ids) * self.block_size
        needed = self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(request.block_ids)
        fresh: list[int] = []
        for _ in range(needed):
            last = fresh[-1] if fresh else (request.block_ids[-1] if request.block_ids else None)
            block_id = self._pop_free(after=last)
            self._evict(block_id)
            self.blocks[block_id].ref_count = 1
            fresh.append(block_id)
        request.block_ids.extend(sorted(fresh))
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        """The (from, to) block moves made since the last call, in order: the runner copies each block's K/V
        before the step that follows, in this order (a block moved twice is moved in turn)."""
        copies, self._copies = self._copies, []
        return copies

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's newly completed full blocks so that others can reuse them."""
        if not self.enable_prefix_caching:
            return
        hashes = self._request_hashes.setdefault(request.request_id, [])
        num_full = request.num_computed_tokens // self.block_size
        tokens = request.all_token_ids
        for i in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else chain_seed(request)
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            block_hash = hash_block(parent, chunk)
            hashes.append(block_hash)
            block = self.blocks[request.block_ids[i]]
            if block.block_hash is None and block_hash not in self.cached_blocks:
                block.block_hash = block_hash
                block.token_ids = chunk
                self.cached_blocks[block_hash] = block.block_id

    def free(self, request: Request) -> None:
        """Drop the request's references. Tail blocks go first into the free queue, so they are
        evicted before the shared prefix blocks that other requests are more likely to hit; a block
        without a hash (a partly filled last block) can never be hit, so it goes to the front, to be
        handed out before any block that could still be."""
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                entry = self._entry_of[block_id] = self._next_entry
                self._next_entry += 1
                self.free_queue[entry] = block_id
                if block.block_hash is None:
                    self.free_queue.move_to_end(entry, last=False)
        request.block_ids = []
        request.num_computed_tokens = 0
        self._request_hashes.pop(request.request_id, None)

    # ---- internals -----------------------------------------------------------------------
    def _pop_free(self, after: int | None) -> int:
        """A free block out of the queue: the one after `after` when it is free (a cached one moved first,
        where cached blocks move), else the least recently freed."""
        wanted = None if after is None else after + 1
        entry = self._entry_of.get(wanted)
        if entry is not None:
            if self.blocks[wanted].block_hash is None or next(iter(self.free_queue)) == entry:
                del self.free_queue[self._entry_of.pop(wanted)]
                return wanted
            if self.move_cached_blocks:
                self._move_to_lru_victim(wanted)
                return wanted
        _, block_id = self.free_queue.popitem(last=False)
        del self._entry_of[block_id]
        return block_id

    def _move_to_lru_victim(self, block_id: int) -> None:
        """Take the cached free block `block_id` out of the queue: its contents move into the least recently
        freed block (evicting that one's), which takes its place in the order."""
        entry = self._entry_of.pop(block_id)
        _, victim_id = self.free_queue.popitem(last=False)
        del self._entry_of[victim_id]
        self._evict(victim_id)
        cached, victim = self.blocks[block_id], self.blocks[victim_id]
        victim.block_hash, victim.token_ids = cached.block_hash, cached.token_ids
        if self.cached_blocks.get(cached.block_hash) == block_id:
            self.cached_blocks[cached.block_hash] = victim_id
        cached.block_hash, cached.token_ids = None, ()
        self.free_queue[entry] = victim_id
        self._entry_of[victim_id] = entry
        self._copies.append((block_id, victim_id))

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_queue[self._entry_of.pop(block_id)]
        block.ref_count += 1

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.cached_blocks.get(block.block_hash) == block_id:
                del self.cached_blocks[block.block_hash]
            block.block_hash = None
            block.token_ids = ()
