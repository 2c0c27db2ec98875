"""The runner's block copies (the block manager's moves of cached blocks): the compiled op and the torch loop
against a reference, in order, for every pool."""

import pytest
import torch

from tests.engine.factories import paged_runner, tiny_engine, tiny_llama
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import SamplingParams
from worker.kernels import native_op


def reference(pools: list[torch.Tensor], copies: list[tuple[int, int]]) -> list[torch.Tensor]:
    out = [pool.clone() for pool in pools]
    for src, dst in copies:
        for pool in out:
            pool[:, dst] = pool[:, src].clone()
    return out


COPIES = [(1, 5), (5, 2), (7, 0)]  # 5 is written, then read: the order matters


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_copies_match_the_reference_in_order(dtype):
    ops = native_op("copy_blocks")
    if ops is None:
        pytest.skip("compiled kernels not built")
    torch.manual_seed(0)
    pools = [torch.randn(3, 8, 4, 16).to(dtype) for _ in range(4)]
    expected = reference(pools, COPIES)
    assert not torch.equal(expected[0], reference(pools, COPIES[::-1])[0])  # the order is seen
    ops.copy_blocks(pools, torch.tensor([c[0] for c in COPIES]), torch.tensor([c[1] for c in COPIES]))
    for got, want in zip(pools, expected, strict=True):
        assert torch.equal(got, want)


def test_compiled_copies_refuse_a_block_out_of_range():
    ops = native_op("copy_blocks")
    if ops is None:
        pytest.skip("compiled kernels not built")
    with pytest.raises(RuntimeError, match="out of range"):
        ops.copy_blocks([torch.zeros(2, 4, 4, 8)], torch.tensor([1]), torch.tensor([4]))


@pytest.mark.parametrize("compiled", [True, False])
def test_the_runner_copies_every_layer_k_and_v(compiled, monkeypatch):
    if compiled and native_op("copy_blocks") is None:
        pytest.skip("compiled kernels not built")
    runner = paged_runner(tiny_llama(), num_blocks=8, block_size=4)
    if not compiled:
        monkeypatch.setattr("worker.model.runner.native_op", lambda name: None)
    pools = [pool for pair in runner.kv_caches for pool in pair]
    torch.manual_seed(1)
    for pool in pools:
        pool.copy_(torch.randn_like(pool))
    expected = reference(pools, COPIES)
    runner.copy_blocks(COPIES)
    for got, want in zip(pools, expected, strict=True):
        assert torch.equal(got, want)


def test_the_engine_steps_make_and_count_the_moves():
    """A growing request takes a finished request's cached block as its next: one move, counted in the step's
    stats (llmserve:kv_block_copies_total), and the prompt that comes back hits the moved prefix."""
    engine = tiny_engine(tiny_llama(), vocab_size=256, block_size=4, budget=64, num_blocks=16, max_num_seqs=8)
    shared = [(11 * i + 5) % 250 for i in range(8)]

    def add(request_id: str, prompt: list[int], max_tokens: int) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.add(engine.make_requests(request_id, PromptInput(token_ids=prompt), params))

    add("grower", [1, 2], 10)  # block 0; its 5th token goes into block 1
    add("first", [*shared, 3], 1)  # blocks 1-3; 1 and 2 cached when it finishes
    copies, cached = 0, None
    for step in range(40):
        if step == 5:
            add("again", [*shared, 4], 4)
        result = engine.step()
        copies += result.stats.num_kv_block_copies if result.stats else 0
        for out in result.outputs:
            if out.group_id == "again" and out.finished:
                cached = out.usage.cached_tokens
        if step > 5 and not engine.has_unfinished():
            break
    assert copies == 1 and cached == 8
    assert engine.scheduler.block_manager.num_used_blocks == 0
