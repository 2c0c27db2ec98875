"""The int8 sketch path of the index against a float32 reference, and its upkeep across writes and background
rebuilds. Pure: no model."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from cache_service import sketch as sketch_mod
from cache_service.index import Partition, Scanner, VectorIndex
from cache_service.sketch import SKETCH_CANDIDATES, SKETCH_MIN_ROWS, SketchBuilder, int8_kernel
from tests.cache.test_index_fp16 import DIM, STORAGE_BOUND, assert_matches_reference, near, units

needs_int8 = pytest.mark.skipif(int8_kernel() is None, reason="no int8 kernel (fbgemm) in this torch build")
N = 24_000


def clustered(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random unit rows, plus 60 clusters of 25 near-duplicates (cosines to their centre ~0.6 to ~0.99)."""
    matrix = units(rng, n)
    centres = rng.choice(n, size=60, replace=False)
    for j, c in enumerate(centres):
        for m in range(1, 26):
            matrix[(c + 131 * m + j) % n] = near(rng, matrix[c], 0.003 * m)
    return matrix


def stored(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


class Fixture:
    """A partition with its own scanner and builder (no pause between builds)."""

    def __init__(self, threads: int = 2, builder: SketchBuilder | None = None) -> None:
        self.scanner = Scanner(threads)
        self.builder = builder or SketchBuilder(groups=threads, gap=0.0)
        self.part = Partition(DIM, "s", self.scanner, self.builder)
        self.live: dict[str, np.ndarray] = {}
        self._reference: tuple[list[str], np.ndarray] | None = (
            None  # live ids and rows (float64), kept until a write
        )

    def add(self, entry_id: str, v: np.ndarray) -> None:
        self.part.add(entry_id, v, f"q-{entry_id}")
        self.live[entry_id] = v
        self._reference = None

    def remove(self, entry_id: str) -> None:
        assert self.part.remove(entry_id)
        del self.live[entry_id]
        self._reference = None

    def check(self, q: np.ndarray, k: int = 4) -> list:
        """Search agrees with the float32 reference over the live entries; similarities are the float32
        products with the stored (float16) rows."""
        found = self.part.search(q, k=k, min_similarity=-1.0)
        if self._reference is None:
            ids = list(self.live)
            self._reference = ids, np.stack([self.live[i] for i in ids]).astype(np.float64)
        ids, matrix = self._reference
        assert_matches_reference(found, matrix, ids, q, k)
        for cand in found:
            assert cand.similarity == pytest.approx(float(stored(self.live[cand.entry_id]) @ q), abs=1e-6)
            assert cand.query == f"q-{cand.entry_id}"
        return found

    def close(self) -> None:
        self.part.close()
        self.builder.close()
        self.scanner.close()

    def __enter__(self) -> Fixture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the service's setting; the scan split runs only then
    yield
    torch.set_num_threads(previous)


@needs_int8
@pytest.mark.parametrize("data", ["random", "clustered"])
@pytest.mark.parametrize("threads", [1, 2])
def test_sketch_finds_the_float32_top_candidates(data: str, threads: int, one_torch_thread: None) -> None:
    rng = np.random.default_rng(11)
    matrix = units(rng, N) if data == "random" else clustered(rng, N)
    with Fixture(threads) as f:
        for i, v in enumerate(matrix):
            f.add(f"e{i}", v)
        assert f.part.settle(timeout=60, rebuild=True)
        sk = f.part.sketch
        assert sk is not None and sk.n == N and sk.changes == 0
        assert len(sk.blocks) % threads == 0
        exact = matrix.astype(np.float64)
        picks = rng.choice(N, size=25, replace=False)
        queries = [near(rng, matrix[c], 0.02) for c in picks] + [near(rng, matrix[c], 0.3) for c in picks]
        queries += list(units(rng, 10))
        for q in queries:
            f.check(q)
            # The prefilter alone: the exact top 4 are among the sketch's SKETCH_CANDIDATES best positions.
            scores = sk.scores(torch.from_numpy(q)[None, :], f.scanner)
            top = set(torch.topk(scores, SKETCH_CANDIDATES).indices.tolist())
            assert set(np.argsort(-(exact @ q))[:4].tolist()) <= top
            assert np.abs(scores.double().numpy() - exact @ q).max() < 0.01


@needs_int8
def test_writes_after_the_snapshot_are_honoured_at_once(one_torch_thread: None) -> None:
    rng = np.random.default_rng(12)
    with Fixture() as f:
        for i, v in enumerate(clustered(rng, N)):
            f.add(f"e{i}", v)
        assert f.part.settle(timeout=60, rebuild=True)
        sk = f.part.sketch
        ids = list(f.live)
        removed = [ids[i] for i in rng.choice(N, size=60, replace=False)]
        old = {entry_id: f.live[entry_id] for entry_id in removed}
        for entry_id in removed:
            f.remove(entry_id)
        updated = [i for i in (ids[j] for j in rng.choice(N, size=100, replace=False)) if i in f.live][:60]
        before = {entry_id: f.live[entry_id] for entry_id in updated}
        for entry_id in updated:
            f.add(entry_id, units(rng, 1)[0])
        added = [f"new{i}" for i in range(100)]
        for i, entry_id in enumerate(added):  # some close to each other and to re-stored entries
            f.add(entry_id, near(rng, f.live[updated[i % 7]], 0.01))
        # 280 changes, under N / 64: no rebuild yet, this is the sketch plus the rows it lacks.
        assert f.part.sketch is sk and f.part._build is None
        assert (sk.dead_count, sk.fresh) == (120, 160)
        for entry_id in removed:  # its own vector: the best match is some other entry
            found = f.check(old[entry_id])
            assert all(c.entry_id in f.live for c in found)
        for entry_id in updated[:30]:
            best = f.check(f.live[entry_id])[0]  # scored with the new vector
            assert best.entry_id == entry_id and abs(best.similarity - 1.0) <= STORAGE_BOUND
            found = f.check(before[entry_id])  # the old one no longer finds it at similarity ~1
            assert all(c.entry_id != entry_id or c.similarity < 0.5 for c in found)
        for entry_id in added[:30]:
            best = f.check(f.live[entry_id])[0]
            assert best.entry_id == entry_id
        for q in units(rng, 5):
            f.check(q, k=10)


@needs_int8
def test_background_rebuild_swaps_in_and_results_stay_correct(one_torch_thread: None) -> None:
    rng = np.random.default_rng(13)
    with Fixture() as f:
        for i, v in enumerate(units(rng, N)):
            f.add(f"e{i}", v)
        assert f.part.settle(timeout=60, rebuild=True)
        first = f.part.sketch
        assert first is not None
        extra = clustered(rng, 2000)
        for i, v in enumerate(extra):  # 2000 changes > N / 64: rebuilds start on the way
            f.add(f"x{i}", v)
            if i % 97 == 0:
                f.remove(f"e{i}")
            if i % 400 == 0:
                f.check(v)
        assert f.part._build is not None or f.part.sketch is not first
        for q in [near(rng, extra[c], 0.05) for c in range(0, 2000, 250)]:
            f.check(q)  # whichever sketch is in place, with whatever it lacks
        f.part.settle(timeout=60)
        assert f.part.sketch is not first and f.part.sketch is not None
        assert f.part.sketch.n > first.n
        for q in [near(rng, extra[c], 0.05) for c in range(0, 2000, 250)] + list(units(rng, 5)):
            f.check(q)


class GatedBuilder(SketchBuilder):
    """Packs only once the gate opens: the test's writes all land while the build is 'in progress', and the
    build then reads the rows as they are after them (the worst case of reading them in place)."""

    def __init__(self) -> None:
        super().__init__(groups=2, gap=0.0)
        self.gate = threading.Event()

    def pack(self, kernel, src, n):  # type: ignore[no-untyped-def]
        assert self.gate.wait(30)
        return super().pack(kernel, src, n)


@needs_int8
def test_rows_written_during_a_build_are_not_trusted_from_it(one_torch_thread: None) -> None:
    rng = np.random.default_rng(14)
    builder = GatedBuilder()
    f = Fixture(builder=builder)
    try:
        vectors = units(rng, SKETCH_MIN_ROWS + 3)
        for i, v in enumerate(vectors[:SKETCH_MIN_ROWS]):
            f.add(f"e{i}", v)
        assert f.part._build is not None and f.part._build.n == SKETCH_MIN_ROWS  # gated
        f.check(vectors[7])  # meanwhile: the float16 scan
        last = f"e{SKETCH_MIN_ROWS - 1}"
        f.remove("e5")  # the last entry moves into row 5
        f.add("c", vectors[SKETCH_MIN_ROWS])  # and the new one takes the last row
        f.add("e100", vectors[SKETCH_MIN_ROWS + 1])  # re-stored in place
        builder.gate.set()
        assert f.part.settle(timeout=60)
        sk = f.part.sketch
        assert sk is not None and sk.n == SKETCH_MIN_ROWS
        # The snapshot's positions 5 (e5: removed), 100 (e100: old vector) and the last one (its entry moved,
        # and the position was then overwritten with c) are dead; `last`, c and e100 are scanned exactly.
        assert (sk.dead_count, sk.fresh) == (3, 3)
        assert sk.dead[[5, 100, SKETCH_MIN_ROWS - 1]].all()
        for entry_id in (last, "c", "e100"):
            best = f.check(f.live[entry_id])[0]
            assert best.entry_id == entry_id and abs(best.similarity - 1.0) <= STORAGE_BOUND
        assert all(c.entry_id != "e5" for c in f.check(vectors[5]))
    finally:
        builder.gate.set()
        f.close()


def test_without_the_int8_kernel_the_float16_scan_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sketch_mod, "_kernel", [None])  # as if the probe had failed
    rng = np.random.default_rng(15)
    matrix = units(rng, SKETCH_MIN_ROWS + 100)
    for index in (VectorIndex(DIM, scan_threads=2), VectorIndex(DIM, scan_threads=2, sketch=False)):
        try:
            ids = [f"e{i}" for i in range(len(matrix))]
            for entry_id, v in zip(ids, matrix, strict=True):
                index.add(entry_id, "p", "s", v, entry_id)
            index.settle(timeout=60, rebuild=True)
            assert index.sketch("p") is None
            for q in [near(rng, matrix[c], 0.2) for c in (3, 500, 4000)]:
                assert_matches_reference(index.search("p", q, 4, -1.0), matrix, ids, q, 4)
        finally:
            index.close()


class FailingBuilder(SketchBuilder):
    def pack(self, kernel, src, n):  # type: ignore[no-untyped-def]
        raise RuntimeError("packing failed")


@needs_int8
def test_a_failed_build_leaves_the_float16_scan() -> None:
    rng = np.random.default_rng(16)
    with Fixture(builder=FailingBuilder(groups=2, gap=0.0)) as f:
        for i, v in enumerate(units(rng, SKETCH_MIN_ROWS + 10)):
            f.add(f"e{i}", v)
        assert not f.part.settle(timeout=60)
        assert f.part._builder is None  # no retry loop
        f.check(near(rng, f.live["e42"], 0.1))


@needs_int8
def test_sketch_follows_the_partition_size_and_the_index_default() -> None:
    rng = np.random.default_rng(17)
    matrix = units(rng, SKETCH_MIN_ROWS)
    index = VectorIndex(DIM, scan_threads=2)
    try:
        for i, v in enumerate(matrix[:-1]):
            index.add(f"e{i}", "p", "s", v, "")
        index.settle(timeout=60)
        assert index.sketch("p") is None  # below SKETCH_MIN_ROWS: float16 only
        index.add("last", "p", "s", matrix[-1], "")
        index.settle(timeout=60)
        assert index.sketch("p") is not None
        for i in range(SKETCH_MIN_ROWS // 2):  # down to half: kept (no flapping)...
            index.remove(f"e{i}")
        assert index.sketch("p") is not None
        index.remove(f"e{SKETCH_MIN_ROWS // 2}")  # ...below half: dropped
        assert index.sketch("p") is None
        q = matrix[-1]
        assert index.search("p", q, 1, 0.9)[0].entry_id == "last"
    finally:
        index.close()


@needs_int8
def test_a_drained_partition_gives_its_memory_back(one_torch_thread: None) -> None:
    """Rows removed (entries expired, a scope invalidated) free the partition's arrays down to twice what
    is left, also while a build reads the old ones in place; what is left is still found."""
    rng = np.random.default_rng(16)
    builder = GatedBuilder()
    f = Fixture(builder=builder)
    try:
        vectors = units(rng, 2 * SKETCH_MIN_ROWS + 1)
        for i, v in enumerate(vectors):
            f.add(f"e{i}", v)
        peak = f.part.nbytes
        assert f.part._build is not None  # gated: it packs the rows of the arrays as they were
        for i in range(SKETCH_MIN_ROWS + 1):
            f.remove(f"e{i}")
        assert f.part.nbytes == peak // 2
        builder.gate.set()
        assert f.part.settle(timeout=60)
        for i in range(SKETCH_MIN_ROWS + 1, 2 * SKETCH_MIN_ROWS + 1, 409):
            assert f.check(vectors[i])[0].entry_id == f"e{i}"
        for i in range(SKETCH_MIN_ROWS + 1, 2 * SKETCH_MIN_ROWS - 9):
            f.remove(f"e{i}")
        assert len(f.part) == 10 and f.part.nbytes <= 64 * DIM * 2
        for i in range(2 * SKETCH_MIN_ROWS - 9, 2 * SKETCH_MIN_ROWS + 1):
            assert f.check(vectors[i])[0].entry_id == f"e{i}"
    finally:
        builder.gate.set()
        f.close()
