"""The float16 index against a float32 reference: same candidates, float32 similarities. Pure: no model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cache_service import index as index_module
from cache_service.index import RESCORE_ROWS, SPLIT_MIN_ROWS, Partition, Scanner, VectorIndex

DIM = 384
# |float16-stored similarity - float32 similarity| for unit vectors (the index's docstring)
STORAGE_BOUND = 2.0**-11


def units(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    m = rng.normal(size=(n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def near(rng: np.random.Generator, v: np.ndarray, noise: float) -> np.ndarray:
    w = v + noise * rng.normal(size=v.shape).astype(np.float32)
    return (w / np.linalg.norm(w)).astype(np.float32)


def assert_matches_reference(found: list, matrix: np.ndarray, ids: list[str], q: np.ndarray, k: int) -> None:
    """The float32 (float64 here) reference's top k, in its order, except that two rows whose reference
    similarities are within twice the storage error of each other may trade places (also across the k-th
    rank); similarities within 1e-3 (in fact within 2^-11) of the reference ones."""
    sims = np.asarray(matrix, dtype=np.float64) @ q.astype(np.float64)  # no copy when already float64
    order = np.argsort(-sims, kind="stable")[:k]
    position = {entry_id: i for i, entry_id in enumerate(ids)}
    assert len(found) == k
    for rank, (cand, ref_row) in enumerate(zip(found, order, strict=True)):
        sim = sims[position[cand.entry_id]]
        if cand.entry_id != ids[ref_row]:
            assert abs(sim - sims[ref_row]) <= 2 * STORAGE_BOUND, (rank, cand, ids[ref_row], sims[ref_row])
        assert abs(cand.similarity - sim) <= min(1e-3, STORAGE_BOUND + 1e-6)
    assert len({c.entry_id for c in found}) == k


@pytest.mark.parametrize("scan_threads", [1, 2])
def test_fp16_index_finds_the_float32_top_candidates(
    scan_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A split scan from 2,048 rows rather than SPLIT_MIN_ROWS (the same code on a tenth of the rows), and one
    # torch thread, the service's setting, where the split runs at all.
    monkeypatch.setattr(index_module, "SPLIT_MIN_ROWS", 2048)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_fp16_index(scan_threads)
    finally:
        torch.set_num_threads(previous)


def check_fp16_index(scan_threads: int) -> None:
    rng = np.random.default_rng(7)
    n = index_module.SPLIT_MIN_ROWS * 2 + 123  # large enough for the scan (and its split), not the exact path
    matrix = units(rng, n)
    ids = [f"e{i}" for i in range(n)]
    # Clusters of near-duplicates around a few centres, so the top candidates are close to each other.
    centres = rng.choice(n, size=20, replace=False)
    for j, c in enumerate(centres):
        for m in range(1, 8):
            matrix[(c + 97 * m + j) % n] = near(rng, matrix[c], 0.05 * m)
    index = VectorIndex(DIM, scan_threads=scan_threads, sketch=False)  # float16 scan; int8: test_index_sketch
    for i, entry_id in enumerate(ids):
        index.add(entry_id, "p", "s", matrix[i], f"q{i}")
    assert index.scan_threads == scan_threads
    assert index._scanner.parts(n) == scan_threads  # the scan is split where there are two threads
    try:
        queries = [near(rng, matrix[c], 0.3) for c in centres] + list(units(rng, 20))
        for q in queries:
            found = index.search("p", q, k=4, min_similarity=-1.0)
            assert_matches_reference(found, matrix, ids, q, 4)
            for cand in found:  # the reported similarity is the float32 product with the stored row
                row = matrix[int(cand.entry_id[1:])].astype(np.float16).astype(np.float32)
                assert cand.similarity == pytest.approx(float(row @ q), abs=1e-6)
                assert cand.query == f"q{cand.entry_id[1:]}"
            # The threshold is applied to those float32 similarities.
            cut = found[1].similarity
            above = index.search("p", q, k=4, min_similarity=cut)
            assert [c.entry_id for c in above] == [c.entry_id for c in found if c.similarity >= cut]
    finally:
        index.close()


def test_split_scan_equals_one_product() -> None:
    rng = np.random.default_rng(1)
    rows = torch.from_numpy(units(rng, SPLIT_MIN_ROWS + 1001).astype(np.float16))
    q = torch.from_numpy(units(rng, 1)[0].astype(np.float16))
    scanner = Scanner(2)
    try:
        previous = torch.get_num_threads()
        torch.set_num_threads(1)  # the split runs only when torch itself runs one thread
        try:
            assert torch.equal(scanner.mv(rows, q), torch.mv(rows, q))
            assert torch.equal(scanner.mv(rows[:100], q), torch.mv(rows[:100], q))
        finally:
            torch.set_num_threads(previous)
    finally:
        scanner.close()


def test_removal_growth_and_updates_against_a_reference() -> None:
    rng = np.random.default_rng(3)
    index = VectorIndex(DIM, scan_threads=2)
    live: dict[str, np.ndarray] = {}
    try:
        for i, v in enumerate(units(rng, 3000)):
            index.add(f"e{i}", "p", "s", v, f"e{i}")
            live[f"e{i}"] = v
        for i in range(0, 3000, 3):  # a third removed: the last rows move into the holes
            assert index.remove(f"e{i}")
            del live[f"e{i}"]
        assert not index.remove("e0")
        for i, v in enumerate(units(rng, 2500), start=3000):  # grows past the old capacity
            index.add(f"e{i}", "p", "s", v, f"e{i}")
            live[f"e{i}"] = v
        for entry_id in ("e1", "e2999", "e3100"):  # re-stored with a new vector, same row
            live[entry_id] = units(rng, 1)[0]
            index.add(entry_id, "p", "s", live[entry_id], entry_id)
        assert len(index) == len(live)
        ids = list(live)
        matrix = np.stack([live[i] for i in ids])
        for entry_id in ids[::97] + ["e1", "e2999", "e3100"]:
            v = live[entry_id]
            best = index.search("p", v, k=1, min_similarity=0.0)
            assert best[0].entry_id == entry_id and best[0].query == entry_id
            assert abs(best[0].similarity - 1.0) <= STORAGE_BOUND
            q = near(rng, v, 0.5)
            found = index.search("p", q, k=4, min_similarity=-1.0)
            assert_matches_reference(found, matrix, ids, q, 4)
        removed = units(rng, 1)[0]
        assert all(c.entry_id in live for c in index.search("p", removed, k=50, min_similarity=-1.0))
    finally:
        index.close()


def test_small_partitions_are_scored_exactly_and_storage_is_float16() -> None:
    rng = np.random.default_rng(5)
    part = Partition(DIM, "s")
    vectors = units(rng, RESCORE_ROWS)
    for i, v in enumerate(vectors):
        part.add(f"e{i}", v, f"q{i}")
    q = near(rng, vectors[4], 0.2)
    found = part.search(q, k=RESCORE_ROWS, min_similarity=-1.0)
    stored = vectors.astype(np.float16).astype(np.float32)
    assert [c.entry_id for c in found] == [f"e{i}" for i in np.argsort(-(stored @ q), kind="stable")]
    assert part.nbytes == part._matrix.shape[0] * DIM * 2
    assert part.search(q, k=0, min_similarity=-1.0) == []
