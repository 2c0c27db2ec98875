"""common/hugepages.py: the kernels' memory is 2 MB-aligned and advised as huge pages, and tensors packed
into an arena keep their own bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from common.hugepages import HUGE_PAGE, PageArena, huge_zeros


def _advised(address: int) -> bool:
    """Whether the mapping holding `address` carries MADV_HUGEPAGE ("hg" in its VmFlags)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return "hg" in line.split()[1:]
    return False


def test_a_pool_is_zeroed_aligned_and_advised() -> None:
    pool = huge_zeros((3, 100, 16, 64), torch.bfloat16)
    assert pool.shape == (3, 100, 16, 64) and pool.dtype == torch.bfloat16
    assert pool.data_ptr() % HUGE_PAGE == 0
    assert not pool.any()
    pool[2, 99, 15, 63] = 1.0  # the last element is its own memory
    assert pool.sum().item() == 1.0
    if sys.platform.startswith("linux"):
        assert _advised(pool.data_ptr())


def test_the_arena_packs_tensors_side_by_side_each_with_its_own_bytes() -> None:
    arena = PageArena(chunk_bytes=1 << 20)
    made = [arena.empty((n, 33), torch.bfloat16) for n in (5, 7, 1000)]
    for i, t in enumerate(made):
        t.fill_(i + 1)
        assert t.data_ptr() % 64 == 0 and t.is_contiguous()
    assert made[1].data_ptr() > made[0].data_ptr()  # the same chunk, in order
    assert made[1].data_ptr() - made[0].data_ptr() < 1024
    assert [int(t.float().mean().item()) for t in made] == [1, 2, 3], "no tensor overlaps another"
    big = arena.empty((1 << 19,), torch.uint8)  # half a chunk or more: a region of its own
    assert big.data_ptr() % HUGE_PAGE == 0
    source = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    copied = arena.copy(source)
    assert torch.equal(copied, source) and copied.data_ptr() != source.data_ptr()


def test_a_chunk_outlives_the_arena_while_a_tensor_uses_it() -> None:
    arena = PageArena(chunk_bytes=1 << 20)
    kept = arena.empty((64,), torch.float32).fill_(7)
    del arena
    torch.empty(1 << 22, dtype=torch.uint8).fill_(0)  # reuse of freed memory would show here
    assert torch.equal(kept, torch.full((64,), 7.0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_HUGEPAGE is Linux's")
def test_packed_amx_or_bf16_weights_land_in_advised_memory() -> None:
    from common.linear import Bf16WeightLinear, Linear, amx_available, bf16_weight_ops

    weight = torch.randn(64, 64).to(torch.bfloat16)
    if amx_available(weight):
        layer = Linear(weight, backend="amx")
    elif bf16_weight_ops() is not None:
        layer = Bf16WeightLinear(weight)
    else:
        pytest.skip("neither the AMX nor the bfloat16-weight kernel is built here")
    assert _advised(layer.weight.data_ptr())
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.allclose(layer(x).float(), x.float() @ weight.float().T, atol=0.1, rtol=0.02)


def test_switched_off_nothing_is_advised(monkeypatch: pytest.MonkeyPatch) -> None:
    """WORKER_HUGE_PAGES=false reaches here through EngineConfig.huge_pages (worker/model/build.py): no
    advice is asked for. (Read from the calls, not from /proc: reused heap memory may carry an earlier
    region's advice.)"""
    from common import hugepages

    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(hugepages, "_madvise", lambda: lambda *args: calls.append(args) or 0)
    hugepages.set_enabled(False)
    try:
        plain = huge_zeros((1 << 21,), torch.uint8)
        assert plain.data_ptr() % HUGE_PAGE == 0 and not calls
    finally:
        hugepages.set_enabled(True)
    advised = huge_zeros((1 << 21,), torch.uint8)
    assert calls == [(advised.data_ptr(), 1 << 21, hugepages.MADV_HUGEPAGE)]
