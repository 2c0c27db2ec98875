"""Block manager: allocation, reference counts, chained prefix hashes, LRU eviction. No model."""

from tests.engine.factories import make_request
from worker.engine.block_manager import BlockManager


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    request = make_request(num_prompt_tokens=10)
    assert bm.allocate(request, 10)
    assert len(request.block_ids) == 3
    assert bm.num_used_blocks == 3
    bm.free(request)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 8
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_allocation_fails_cleanly_when_out_of_blocks():
    bm = BlockManager(num_blocks=2, block_size=4)
    request = make_request(num_prompt_tokens=12)
    assert not bm.allocate(request, 12)
    assert request.block_ids == [] and bm.num_free_blocks == 2


def _compute(bm: BlockManager, request, num_tokens: int) -> None:
    cached = bm.find_cached_prefix(request)
    assert bm.allocate(request, num_tokens - len(cached) * bm.block_size, cached)
    request.num_computed_tokens = num_tokens
    bm.cache_full_blocks(request)


def test_prefix_hit_reuses_blocks_with_reference_counts():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 14))  # 13 tokens: 3 full blocks
    first = make_request(prompt=prompt)
    _compute(bm, first, 13)
    second = make_request(prompt=prompt[:12] + [99, 100])
    hits = bm.find_cached_prefix(second)
    assert hits == first.block_ids[:3]
    assert bm.allocate(second, 2, hits)
    assert second.num_computed_tokens == 12
    assert all(bm.blocks[b].ref_count == 2 for b in hits)


def test_last_prompt_token_is_never_cached():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 9))  # exactly 2 full blocks
    first = make_request(prompt=prompt)
    _compute(bm, first, 8)
    again = make_request(prompt=prompt)
    assert len(bm.find_cached_prefix(again)) == 1  # only the first block: the last token must run


def test_hash_is_chained_so_same_block_after_different_prefix_misses():
    bm = BlockManager(num_blocks=16, block_size=4)
    first = make_request(prompt=[1, 2, 3, 4, 5, 6, 7, 8, 9])
    _compute(bm, first, 9)
    other = make_request(prompt=[9, 9, 9, 9, 5, 6, 7, 8, 9])
    assert bm.find_cached_prefix(other) == []


def test_token_recheck_rejects_a_hash_collision():
    bm = BlockManager(num_blocks=16, block_size=4)
    first = make_request(prompt=[1, 2, 3, 4, 5])
    _compute(bm, first, 5)
    block = bm.blocks[first.block_ids[0]]
    block.token_ids = (4, 3, 2, 1)  # simulate a different block that collided on the hash
    assert bm.find_cached_prefix(make_request(prompt=[1, 2, 3, 4, 5])) == []


def test_freed_blocks_keep_their_hash_until_reused_and_lru_is_evicted_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    old = make_request(prompt=[1, 2, 3, 4, 5])
    _compute(bm, old, 5)
    bm.free(old)
    assert bm.find_cached_prefix(make_request(prompt=[1, 2, 3, 4, 5])) != []  # still hit after free
    newer = make_request(prompt=[7, 7, 7, 7, 8])
    _compute(bm, newer, 5)
    bm.free(newer)
    # Three fresh blocks: the two partly filled ones (never hit) first, then the least recently freed
    # full one: the newer prefix survives.
    filler = make_request(prompt=[50] * 12)
    assert bm.allocate(filler, 12)
    assert bm.find_cached_prefix(make_request(prompt=[7, 7, 7, 7, 8])) != []
    assert bm.find_cached_prefix(make_request(prompt=[1, 2, 3, 4, 5])) == []


def test_a_partly_filled_block_is_handed_out_before_a_cached_one_freed_after_it():
    bm = BlockManager(num_blocks=4, block_size=4)
    first = make_request(prompt=[1, 2, 3, 4, 5, 6])  # a full block (cached) and a partial one
    _compute(bm, first, 6)
    bm.free(first)
    second = make_request(prompt=[9, 9, 9, 9, 9, 9])
    _compute(bm, second, 6)
    partial = second.block_ids[1]
    bm.free(second)
    # LRU alone would hand out first's blocks; the partial block of second goes first, as it is never hit.
    filler = make_request(prompt=[50] * 4)
    assert bm.allocate(filler, 4) and filler.block_ids == [partial]
    assert bm.find_cached_prefix(make_request(prompt=[1, 2, 3, 4, 5, 6])) != []
    assert bm.find_cached_prefix(make_request(prompt=[9, 9, 9, 9, 9, 9])) != []


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    first = make_request(prompt=list(range(1, 10)))
    _compute(bm, first, 9)
    assert bm.find_cached_prefix(make_request(prompt=list(range(1, 10)))) == []


def test_a_growing_request_takes_the_free_block_after_its_last_out_of_lru_order():
    bm = BlockManager(num_blocks=8, block_size=4)
    first, second = make_request(prompt=[1] * 8), make_request(prompt=[2] * 8)
    assert bm.allocate(first, 8) and bm.allocate(second, 8)
    assert (first.block_ids, second.block_ids) == ([0, 1], [2, 3])
    bm.free(first)  # never cached: to the front of the queue, ahead of 4..7
    assert bm.allocate(second, 9) and second.block_ids == [2, 3, 4]
    third = make_request(prompt=[3] * 4)
    assert bm.allocate(third, 4) and third.block_ids == [0]  # the LRU front otherwise


def test_a_cached_block_taken_as_next_moves_into_the_lru_victim_at_its_place_in_the_order():
    bm = BlockManager(num_blocks=8, block_size=4)
    grower, cached, other = (
        make_request(prompt=[1] * 8),
        make_request(prompt=[2] * 8),
        make_request(prompt=[3] * 13),
    )
    assert bm.allocate(grower, 8)
    _compute(bm, cached, 8)  # blocks 2 and 3, both cached
    _compute(bm, other, 12)  # blocks 4, 5 and 6, cached; 7 stays free
    bm.free(cached)
    bm.free(other)  # LRU order: 7, 3, 2, 6, 5, 4 (each request's tail first)
    assert bm.take_copies() == []
    assert bm.allocate(grower, 9) and grower.block_ids == [0, 1, 2]
    assert bm.take_copies() == [(2, 7)] and bm.take_copies() == []  # 2's K/V go to 7, the LRU victim
    assert bm.find_cached_prefix(make_request(prompt=[2] * 9)) == [7, 3]
    # 7 holds 2's place in the order (3, 7, 6, 5, 4): evicted after 3, before the blocks freed after it.
    taken = []
    for _ in range(2):
        filler = make_request(prompt=[9] * 4)
        assert bm.allocate(filler, 4)
        taken += filler.block_ids
    assert taken == [3, 7] and bm.take_copies() == []
    assert bm.find_cached_prefix(make_request(prompt=[3] * 13)) == [4, 5, 6]


def test_the_lru_front_taken_as_next_needs_no_copy():
    bm = BlockManager(num_blocks=4, block_size=4)
    grower, cached = make_request(prompt=[1] * 4), make_request(prompt=[2] * 8)
    assert bm.allocate(grower, 4)
    _compute(bm, cached, 8)  # blocks 1 and 2, cached
    bm.free(cached)  # LRU order: 3, 2, 1
    filler = make_request(prompt=[9] * 8)
    assert bm.allocate(filler, 8) and filler.block_ids == [2, 3]  # 3, then 2 (3's next, 4, does not exist)
    assert bm.allocate(grower, 5) and grower.block_ids == [0, 1] and bm.take_copies() == []


def test_the_fresh_blocks_of_one_allocation_are_in_ascending_order():
    bm = BlockManager(num_blocks=8, block_size=4)
    old = make_request(prompt=[5] * 16)
    _compute(bm, old, 16)
    assert old.block_ids == [0, 1, 2, 3]
    bm.free(old)  # cached: to the back, tail first (3, 2, 1, 0) after the never-used 4..7
    filler = make_request(prompt=[6] * 16)
    assert bm.allocate(filler, 16) and filler.block_ids == [4, 5, 6, 7]
    new = make_request(prompt=[7] * 12)
    assert bm.allocate(new, 12) and new.block_ids == [1, 2, 3]  # popped 3, 2, 1


def test_where_cached_blocks_stay_put_a_cached_next_block_is_left_for_the_lru_front():
    bm = BlockManager(num_blocks=8, block_size=4, move_cached_blocks=False)
    grower, cached, other = (
        make_request(prompt=[1] * 8),
        make_request(prompt=[2] * 8),
        make_request(prompt=[3] * 4),
    )
    assert bm.allocate(grower, 8)
    _compute(bm, cached, 8)  # blocks 2 and 3, cached
    assert bm.allocate(other, 4)  # block 4; 5, 6, 7 stay free
    bm.free(cached)  # LRU order: 5, 6, 7, 3, 2
    assert bm.allocate(grower, 9) and grower.block_ids == [0, 1, 5] and bm.take_copies() == []
    assert bm.find_cached_prefix(make_request(prompt=[2] * 9)) == [2, 3]
    bm.free(other)  # never cached: to the front
    assert bm.allocate(grower, 13) and grower.block_ids == [0, 1, 5, 6]  # 6 follows 5 and is free
