"""The cache's vector index against FAISS and usearch at 10k, 100k and 1M entries (issue 14: keep the
hand-written index only if it wins).

Data. ~1,000 real all-MiniLM-L6-v2 embeddings (the service's embedder, float32) of the labelled
questions in tools/cache/data/cache_pairs.jsonl, plus synthetic vectors to reach the size: drawn from a
Gaussian with the real embeddings' mean and covariance (so the synthetic
rows keep MiniLM's anisotropy: mean direction, spread
spectrum), normalized, in groups of 1-20 rewordings around a centre (cosine ~0.87-0.97 to it). Queries, per
size: real paraphrases whose original is stored (the other side of a should-hit pair, never stored itself),
synthetic near-duplicates of stored rows (cosine ~0.85-0.96) and novel vectors from the same distribution
(nothing close stored: the hardest case for an approximate index, and a cache miss anyway).

Measured per size in one fresh process: every implementation is built in turn (build time: every entry added
as the resync adds them, plus whatever the index needs before it serves, i.e. the hand-written index's int8
sketch, settled), then the queries are interleaved (each query goes to every implementation, in a rotating
order, so load from other jobs on the machine falls on all alike): search latency of one query (k=4, the
service's TOP_K) as wall time and as CPU time of the process, recall@1 against exact float32 brute force (the
top result is the true nearest neighbour by id, or within 1e-3 of its similarity: float16 storage may swap two
rows closer than that); then single adds and removes after the build. Memory: index bytes per entry as the
structures hold them, and (--memory) the RSS growth over one build alone in a fresh process.

    .venv/bin/python -m studies.vector_index_bench [--sizes 10000,100000,1000000] [--memory] [--write-docs]

faiss-cpu and usearch are not dependencies of the service: install them by hand to run this
(`pip install faiss-cpu==1.15.1 usearch==2.26.6`); a library that is absent is reported as such.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import write_section

ROOT = Path(__file__).resolve().parent.parent
DIM = 384
K = 4  # cache_service.core.TOP_K
WORK = Path(os.environ.get("VECTOR_BENCH_DIR", "/tmp/vector_index_bench"))
IMPLS = ("handwritten", "handwritten-2t", "handwritten-fp16", "faiss-flat", "faiss-sq-fp16", "usearch-hnsw")
LABELS = {
    "handwritten": "hand-written (float16 rows, int8 sketch >= 4k rows, float32 re-score)",
    "handwritten-2t": "hand-written, 2 scan threads (the service's setting)",
    "handwritten-fp16": "hand-written without the int8 sketch (float16 scan only)",
    "faiss-flat": "FAISS IndexFlatIP (float32, exact) in IndexIDMap2",
    "faiss-sq-fp16": "FAISS IndexScalarQuantizer fp16 (exact on float16 rows) in IndexIDMap2",
    "usearch-hnsw": "usearch HNSW (float16, M=16, ef_add 128, ef_search 64)",
}
TIE = 1e-3


# -- data --


def real_texts() -> tuple[list[str], list[tuple[str, str]]]:
    """(texts to store, (query, its stored original) pairs): single-turn texts of the labelled pairs."""
    rows = [json.loads(line) for line in (ROOT / "tools/cache/data/cache_pairs.jsonl").open()]
    rows = [r for r in rows if isinstance(r["a"], str) and isinstance(r["b"], str)]
    originals = {r["a"] for r in rows}
    queries = {r["b"]: r["a"] for r in rows if r["should_hit"] and r["b"] not in originals}
    stored = sorted({t for r in rows for t in (r["a"], r["b"])} - set(queries))
    return stored, sorted(queries.items())


def real_embeddings() -> tuple[np.ndarray, np.ndarray]:
    path = WORK / "real.npz"
    if path.exists():
        data = np.load(path)
        return data["stored"], data["queries"]
    from cache_service.embedder import Embedder

    stored, pairs = real_texts()
    embedder = Embedder(dtype="float32")

    def encode(texts: list[str]) -> np.ndarray:
        return np.concatenate([embedder.encode(texts[i : i + 64]) for i in range(0, len(texts), 64)])

    s, q = encode(stored), encode([p[0] for p in pairs])
    WORK.mkdir(parents=True, exist_ok=True)
    np.savez(path, stored=s, queries=q)
    return s, q


class Distribution:
    """A Gaussian with the real embeddings' mean and covariance; samples normalized."""

    def __init__(self, real: np.ndarray) -> None:
        self.mean = real.mean(axis=0)
        _, s, vt = np.linalg.svd(real - self.mean, full_matrices=False)
        self.basis = (s[:, None] / np.sqrt(len(real) - 1)) * vt  # z @ basis ~ N(0, cov)

    def deviations(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return (rng.standard_normal((n, self.basis.shape[0]), dtype=np.float32) @ self.basis).astype(
            np.float32
        )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return normalized(self.mean + self.deviations(rng, n))

    def near(self, rng: np.random.Generator, rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
        scale = rng.uniform(lo, hi, size=(len(rows), 1)).astype(np.float32)
        return normalized(rows + scale * self.deviations(rng, len(rows)))


def normalized(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def synthetic(dist: Distribution, rng: np.random.Generator, n: int) -> np.ndarray:
    out = np.empty((n, DIM), dtype=np.float32)
    filled = 0
    while filled < n:
        sizes = np.minimum(1 + rng.geometric(0.35, size=8192) - 1, 20)
        centres = dist.sample(rng, len(sizes))
        members = dist.near(rng, np.repeat(centres, sizes, axis=0), 0.25, 0.6)
        take = min(n - filled, len(members))
        out[filled : filled + take] = members[:take]
        filled += take
    return out


def make_data(n: int, per_kind: int) -> Path:
    path = WORK / f"data_{n}.npz"
    if path.exists():
        return path
    real, real_queries = real_embeddings()
    dist = Distribution(real)
    rng = np.random.default_rng(n)
    rows = np.concatenate([real, synthetic(dist, rng, n - len(real))])
    rows = rows[rng.permutation(n)]
    picks = rng.choice(n, size=per_kind, replace=False)
    queries = {
        "paraphrase": real_queries[
            rng.choice(len(real_queries), size=min(per_kind, len(real_queries)), replace=False)
        ],
        "near-dup": dist.near(rng, rows[picks], 0.3, 0.6),
        "novel": dist.sample(rng, per_kind),
    }
    truth = {}
    for kind, q in queries.items():
        best = np.full(len(q), -np.inf, dtype=np.float32)
        arg = np.zeros(len(q), dtype=np.int64)
        for a in range(0, n, 65536):
            s = rows[a : a + 65536] @ q.T  # float32 exact
            i = s.argmax(axis=0)
            better = s[i, np.arange(len(q))] > best
            best[better] = s[i, np.arange(len(q))][better]
            arg[better] = a + i[better]
        truth[kind] = (arg, best)
    np.savez(
        path,
        rows=rows,
        **{f"q_{k}": v for k, v in queries.items()},
        **{f"t_{k}": v[0] for k, v in truth.items()},
        **{f"s_{k}": v[1] for k, v in truth.items()},
    )
    return path


# -- implementations behind one small interface (string entry ids, as the service's) --


class Handwritten:
    def __init__(self, threads: int = 1, sketch: bool = True) -> None:
        from cache_service.index import VectorIndex

        self.index = VectorIndex(DIM, scan_threads=threads, sketch=sketch)

    def build(self, ids: list[str], rows: np.ndarray) -> None:
        for entry_id, v in zip(ids, rows, strict=True):
            self.index.add(entry_id, "p", "s", v, "")
        self.index.settle(timeout=600, rebuild=True)

    def add(self, entry_id: str, v: np.ndarray) -> None:
        self.index.add(entry_id, "p", "s", v, "")

    def remove(self, entry_id: str) -> None:
        self.index.remove(entry_id)

    def search(self, q: np.ndarray) -> list[tuple[str, float]]:
        return [(c.entry_id, c.similarity) for c in self.index.search("p", q, K, -1.0)]

    def nbytes(self) -> int:
        part = self.index._partitions["p"]
        sk = part.sketch
        sketch = sk.n * (DIM + 4 + 8) if sk is not None else 0  # int8 rows, a scale, a dead flag + id ref
        return len(part) * (DIM * 2 + 3 * 8) + sketch  # float16 rows, stamp/positions

    def close(self) -> None:
        self.index.close()


class Keyed:
    """String entry ids <-> the int64 keys a library stores."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.ids: dict[int, str] = {}
        self.next = 0

    def key(self, entry_id: str) -> int:
        self.next += 1
        self.keys[entry_id] = self.next
        self.ids[self.next] = entry_id
        return self.next

    def drop(self, entry_id: str) -> int | None:
        key = self.keys.pop(entry_id, None)
        if key is not None:
            del self.ids[key]
        return key


class Faiss(Keyed):
    def __init__(self, kind: str) -> None:
        super().__init__()
        import faiss

        self.faiss = faiss
        faiss.omp_set_num_threads(1)
        base = (
            faiss.IndexFlatIP(DIM)
            if kind == "flat"
            else faiss.IndexScalarQuantizer(DIM, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        )
        self.index = faiss.IndexIDMap2(base)
        self.base = base

    def build(self, ids: list[str], rows: np.ndarray) -> None:
        for a in range(0, len(ids), 1000):  # the resync's batches
            keys = np.array([self.key(i) for i in ids[a : a + 1000]], dtype=np.int64)
            self.index.add_with_ids(rows[a : a + 1000], keys)

    def add(self, entry_id: str, v: np.ndarray) -> None:
        self.index.add_with_ids(v[None, :], np.array([self.key(entry_id)], dtype=np.int64))

    def remove(self, entry_id: str) -> None:
        key = self.drop(entry_id)
        if key is not None:
            self.index.remove_ids(np.array([key], dtype=np.int64))

    def search(self, q: np.ndarray) -> list[tuple[str, float]]:
        sims, keys = self.index.search(q[None, :], K)
        return [(self.ids[int(k)], float(s)) for k, s in zip(keys[0], sims[0], strict=True) if k >= 0]

    def nbytes(self) -> int:
        return self.index.ntotal * (self.base.code_size + 8 * 2)  # codes, id list and the id -> row map

    def close(self) -> None:
        pass


class BuildTooLong(Exception):
    pass


class Usearch(Keyed):
    def __init__(self, budget_s: float = float("inf")) -> None:
        super().__init__()
        from usearch.index import Index

        self.index = Index(ndim=DIM, metric="ip", dtype="f16")
        self.budget_s = budget_s

    def build(self, ids: list[str], rows: np.ndarray) -> None:
        started = time.perf_counter()
        for a in range(0, len(ids), 1000):
            if time.perf_counter() - started > self.budget_s:
                rate = a / (time.perf_counter() - started)
                raise BuildTooLong(
                    f"build over {self.budget_s:.0f} s: {a:,} of {len(ids):,} inserted ({rate:.0f}/s)"
                )
            keys = np.array([self.key(i) for i in ids[a : a + 1000]], dtype=np.uint64)
            self.index.add(keys, rows[a : a + 1000], threads=2)  # the resync may use both cores

    def add(self, entry_id: str, v: np.ndarray) -> None:
        self.index.add(self.key(entry_id), v, threads=1)

    def remove(self, entry_id: str) -> None:
        key = self.drop(entry_id)
        if key is not None:
            self.index.remove(key)

    def search(self, q: np.ndarray) -> list[tuple[str, float]]:
        m = self.index.search(q, K, threads=1)
        return [(self.ids[int(k)], 1.0 - float(d)) for k, d in zip(m.keys, m.distances, strict=True)]

    def nbytes(self) -> int:
        return int(self.index.memory_usage)

    def close(self) -> None:
        pass


def make(impl: str) -> Any:
    if impl == "handwritten":
        return Handwritten(1)
    if impl == "handwritten-2t":
        return Handwritten(2)
    if impl == "handwritten-fp16":
        return Handwritten(1, sketch=False)
    if impl == "faiss-flat":
        return Faiss("flat")
    if impl == "faiss-sq-fp16":
        return Faiss("fp16")
    if impl == "usearch-hnsw":
        return Usearch(float(os.environ.get("VECTOR_BENCH_BUILD_BUDGET_S", "inf")))
    raise ValueError(impl)


# -- every implementation at one size, in one process (fresh for each size) --


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def child(impls: list[str], path: Path) -> list[dict[str, Any]]:
    """Builds each implementation in turn (build time, RSS growth), then times the searches interleaved: each
    query goes to every implementation in a rotating order, so load from other jobs on the machine falls on
    all of them alike."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)  # the service's settings (cache_service/server.py)
    threadpool_limits(limits=1, user_api="blas")
    data = np.load(path)
    rows = np.ascontiguousarray(data["rows"])
    n = len(rows)
    ids = [f"e{i}" for i in range(n)]
    built: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    for impl in impls:
        try:
            index = make(impl)
        except ImportError as exc:
            out[impl] = {"impl": impl, "n": n, "error": f"not installed ({exc})"}
            continue
        gc.collect()
        rss0 = rss()
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            index.build(ids, rows)
        except BuildTooLong as exc:
            out[impl] = {"impl": impl, "n": n, "error": str(exc)}
            index.close()
            continue
        build_wall, build_cpu = time.perf_counter() - w0, time.process_time() - c0
        gc.collect()
        out[impl] = {
            "impl": impl,
            "n": n,
            "build_s": build_wall,
            "build_cpu_s": build_cpu,
            "bytes_per_entry": index.nbytes() / n,
            "rss_mb": (rss() - rss0) / 2**20,
        }
        built[impl] = index
        print(f"built {impl} at {n:,}: {build_wall:.1f} s", file=sys.stderr, flush=True)
    names = list(built)
    lat_wall: dict[str, list[float]] = {i: [] for i in names}
    lat_cpu: dict[str, list[float]] = {i: [] for i in names}
    turn = 0
    for kind in ("paraphrase", "near-dup", "novel"):
        queries, truth, best = data[f"q_{kind}"], data[f"t_{kind}"], data[f"s_{kind}"]
        hits = dict.fromkeys(names, 0)
        close = dict.fromkeys(names, 0)
        for impl in names:
            for q in queries[:5]:
                built[impl].search(q)  # warm
        for q, t, b in zip(queries, truth, best, strict=True):
            turn += 1
            for impl in names[turn % len(names) :] + names[: turn % len(names)]:
                w, c = time.perf_counter(), time.process_time()
                found = built[impl].search(q)
                lat_wall[impl].append(time.perf_counter() - w)
                lat_cpu[impl].append(time.process_time() - c)
                hits[impl] += bool(found) and found[0][0] == ids[t]
                top = int(found[0][0][1:]) if found else -1
                close[impl] += top >= 0 and float(rows[top] @ q) >= b - TIE
        for impl in names:
            out[impl][f"recall_{kind}"] = hits[impl] / len(queries)
            out[impl][f"close_{kind}"] = close[impl] / len(queries)
    writes = 200 if n <= 100_000 else 50
    fresh = normalized(
        rows[:writes] + 0.5 * np.random.default_rng(0).standard_normal((writes, DIM), dtype=np.float32)
    )
    for impl in names:
        r = out[impl]
        r["search_p50_ms"] = pct(lat_wall[impl], 50) * 1e3
        r["search_p99_ms"] = pct(lat_wall[impl], 99) * 1e3
        r["search_cpu_p50_ms"] = pct(lat_cpu[impl], 50) * 1e3
        r["search_cpu_p99_ms"] = pct(lat_cpu[impl], 99) * 1e3
        r["queries"] = len(lat_wall[impl])
        # Single writes after the build: `writes` new entries, then their removal.
        adds, removes = [], []
        for i, v in enumerate(fresh):
            w = time.perf_counter()
            built[impl].add(f"new{i}", v)
            adds.append(time.perf_counter() - w)
        for i in range(len(fresh)):
            w = time.perf_counter()
            built[impl].remove(f"new{i}")
            removes.append(time.perf_counter() - w)
        r["add_us"] = pct(adds, 50) * 1e6
        r["remove_us"] = pct(removes, 50) * 1e6
        built[impl].close()
    return list(out.values())


def memory_child(impl: str, path: Path) -> dict[str, Any]:
    """RSS growth over one build, alone in a fresh process (in the shared one, a build reuses what the
    previous one freed)."""
    import torch

    torch.set_num_threads(1)
    rows = np.ascontiguousarray(np.load(path)["rows"])
    ids = [f"e{i}" for i in range(len(rows))]
    index = make(impl)
    gc.collect()
    rss0 = rss()
    try:
        index.build(ids, rows)
    except BuildTooLong as exc:
        return {"impl": impl, "n": len(rows), "kind": "memory", "error": str(exc)}
    gc.collect()
    return {"impl": impl, "n": len(rows), "kind": "memory", "rss_mb": (rss() - rss0) / 2**20}


def partitions_child(impl: str, parts: int, per: int) -> dict[str, Any]:
    """Many small partitions (one per conversation prefix or system prompt): RSS per partition."""
    rng = np.random.default_rng(0)
    rows = normalized(rng.standard_normal((parts * per, DIM), dtype=np.float32))
    from cache_service.index import VectorIndex

    make(impl).close()  # imports and one-off setup outside the measurement
    gc.collect()
    rss0 = rss()
    if impl.startswith("handwritten"):
        index = VectorIndex(DIM, sketch=impl != "handwritten-fp16")
        for i, v in enumerate(rows):
            index.add(f"e{i}", f"p{i // per}", "s", v, "")
        keep: Any = index
    else:  # one index per partition, through the same adapters
        keep = []
        for p in range(parts):
            index = make(impl)
            index.build([f"e{i}" for i in range(p * per, (p + 1) * per)], rows[p * per : (p + 1) * per])
            keep.append(index)
    gc.collect()
    return {"impl": impl, "parts": parts, "per": per, "kb_per_partition": (rss() - rss0) / parts / 1024}


def run_child(args: list[str], timeout: float) -> Any:
    cmd = [sys.executable, "-m", "studies.vector_index_bench", *args]
    try:
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": f"exit status {done.returncode} (its stderr above)"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- report --


def fmt_row(r: dict[str, Any]) -> str:
    name = f"{r['impl']}"
    if "error" in r:
        return f"| {r.get('n', 0):,} | {name} | {r['error']} |" + " |" * 9
    recall = " / ".join(f"{r[f'recall_{k}']:.3f}" for k in ("paraphrase", "near-dup", "novel"))
    close = " / ".join(f"{r[f'close_{k}']:.3f}" for k in ("paraphrase", "near-dup", "novel"))
    return (
        f"| {r['n']:,} | {name} | {r['search_p50_ms']:.3f} / {r['search_p99_ms']:.3f} | "
        f"{r['search_cpu_p50_ms']:.3f} / {r['search_cpu_p99_ms']:.3f} | {r['bytes_per_entry']:.0f} | "
        f"{r['rss_mb']:.0f}{'' if r.get('rss_fresh') else '*'} | "
        f"{r['build_s']:.1f} ({r['build_cpu_s']:.1f}) | "
        f"{r['add_us']:.0f} / {r['remove_us']:.0f} | {recall} | {close} |"
    )


HEADER = [
    "| entries | index | search p50 / p99 ms (wall) | search p50 / p99 ms (CPU) | index bytes / entry "
    "| RSS growth MB | build s wall (CPU) | one add / remove us (p50) "
    "| recall@1 paraphrase / near-dup / novel | top-1 within 1e-3 of the best |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--queries", type=int, default=200, help="queries per kind (paraphrase, near-dup, novel)")
    p.add_argument("--big-queries", type=int, default=100, help="queries per kind from 1M entries")
    p.add_argument("--timeout", type=float, default=900, help="seconds per implementation and size")
    p.add_argument("--partitions", default="", help="e.g. 2000x5: many small partitions, RSS per partition")
    p.add_argument("--results", type=Path, default=WORK / "results.jsonl", help="append each result here")
    p.add_argument("--report-only", action="store_true", help="render --results, run nothing")
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("IMPLS", "DATA"), help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true", help="RSS growth per build, each in a fresh process")
    p.add_argument("--memory-child", nargs=2, metavar=("IMPL", "DATA"), help=argparse.SUPPRESS)
    p.add_argument("--partitions-child", nargs=3, metavar=("IMPL", "PARTS", "PER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0].split(","), Path(args.child[1]))))
        return
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child[0], Path(args.memory_child[1]))))
        return
    if args.partitions_child:
        impl, parts, per = args.partitions_child
        print(json.dumps(partitions_child(impl, int(parts), int(per))))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for n in (int(s) for s in args.sizes.split(",") if s):
            started = time.perf_counter()
            path = make_data(n, args.queries if n < 1_000_000 else args.big_queries)
            print(f"data {n:,}: {time.perf_counter() - started:.1f} s", flush=True)
            if args.memory:
                for impl in args.impls.split(","):
                    r = run_child(["--memory-child", impl, str(path)], args.timeout)
                    r |= {"impl": impl, "n": n, "kind": "memory"}
                    print(json.dumps(r), flush=True)
                    with args.results.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                continue
            load = os.getloadavg()[0]
            got = run_child(["--child", args.impls, str(path)], args.timeout)
            results = (
                got if isinstance(got, list) else [got | {"impl": i, "n": n} for i in args.impls.split(",")]
            )
            for r in results:
                r["load"] = [load, os.getloadavg()[0]]
                print(json.dumps(r), flush=True)
                with args.results.open("a") as f:
                    f.write(json.dumps(r) + "\n")
        if args.partitions:
            parts, per = (int(x) for x in args.partitions.split("x"))
            for impl in args.impls.split(","):
                r = run_child(["--partitions-child", impl, str(parts), str(per)], args.timeout)
                r |= {"impl": impl, "kind": "partitions"}
                print(json.dumps(r), flush=True)
                with args.results.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    body = render(args.results)
    print(body)
    if args.write_docs:
        write_section("vector-index", body)


def render(results: Path) -> str:
    rows = [json.loads(line) for line in results.open()] if results.exists() else []
    latest: dict[tuple[str, Any], dict[str, Any]] = {}
    memory: dict[tuple[str, int], float] = {}
    for r in rows:
        if r.get("kind") == "memory":
            if "rss_mb" in r:
                memory[(r["impl"], r["n"])] = r["rss_mb"]
            continue
        latest[(r["impl"], r.get("n") if r.get("kind") != "partitions" else "parts")] = r
    for (impl, n), r in latest.items():
        if (impl, n) in memory and "error" not in r:
            r["rss_mb"] = memory[(impl, n)]
            r["rss_fresh"] = True
    sized = sorted(
        (r for (_, n), r in latest.items() if n != "parts"),
        key=lambda r: (r["n"], IMPLS.index(r["impl"]) if r["impl"] in IMPLS else 9),
    )
    parts = [r for (_, n), r in latest.items() if n == "parts" and "error" not in r]
    lines = [
        "## Vector index: hand-written against FAISS and usearch",
        "",
        *HEADER,
        *(fmt_row(r) for r in sized),
    ]
    if parts:
        lines += [
            "",
            "Many small partitions: "
            + "; ".join(
                f"{r['impl']} {r['kb_per_partition']:.1f} KB per partition"
                f" ({r['parts']:,} x {r['per']} entries)"
                for r in parts
            )
            + ".",
        ]
    lines += ["", "Implementations: " + "; ".join(f"`{k}`: {v}" for k, v in LABELS.items()) + "."]
    lines += ["", *notes(sized, rows)]
    return "\n".join(lines)


def notes(sized: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[str]:
    got = {(r["impl"], r["n"]): r for r in sized if "error" not in r}

    def v(impl: str, n: int, key: str) -> float:
        return float(got[(impl, n)][key]) if (impl, n) in got else float("nan")

    loads = [x for r in rows for x in (r.get("load") or [])]
    hw, sq, us = "handwritten", "faiss-sq-fp16", "usearch-hnsw"
    k100, cpu = 100_000, "search_cpu_p50_ms"
    return [
        "Command: `.venv/bin/python -m studies.vector_index_bench --write-docs` (runs at 10k, 100k and 1M,"
        " then `--memory`; faiss-cpu 1.15.1 and usearch 2.26.6 installed by hand). Machine: 2 vCPUs (AVX2, no"
        " AVX-512) shared with other jobs: load average "
        + (f"{min(loads):.1f}-{max(loads):.1f}" if loads else "n/a")
        + " during the runs, all at nice 19. Wall times are mostly waiting for a core; CPU times are"
        " inflated too (shared caches and memory bandwidth) but less, and the queries were interleaved, so"
        " compare rows of one size rather than absolute figures: on a quieter machine the cache-latency"
        " section measured the hand-written index at 0.24 ms (10k) and 1.76 ms (100k) p50. One thread per"
        " search everywhere (`handwritten-2t`: the service's two scan threads, no gain on this loaded"
        " machine).",
        "",
        "Data: 1,003 real all-MiniLM-L6-v2 embeddings of the questions in"
        " `tools/cache/data/cache_pairs.jsonl`, the rest synthetic: a Gaussian with the real embeddings'"
        " mean and covariance, in groups of 1-20"
        " rewordings (cosine ~0.87-0.97 to their centre). Queries per size (200 of each kind, 100 at 1M):"
        " real paraphrases of stored questions, synthetic near-duplicates of stored rows (cosine"
        " ~0.85-0.96), and"
        " novel vectors (nothing close stored). RSS without `*`: one build alone in a fresh process; with"
        " `*`: growth inside the shared process (reuses what an earlier build freed: a floor, not a figure).",
        "",
        "**Decision: the hand-written index stays.** Against FAISS's exact indexes it searches faster from"
        f" 100k ({v(hw, 100_000, cpu):.1f} vs {v(sq, 100_000, cpu):.1f} ms CPU p50 at 100k with float16"
        f" storage, {v(hw, 1_000_000, cpu):.0f} vs {v(sq, 1_000_000, cpu):.0f} ms at 1M; float32 IndexFlatIP"
        f" {v('faiss-flat', 1_000_000, 'search_cpu_p50_ms'):.0f} ms), and it removes or re-stores an entry in"
        f" {v(hw, 1_000_000, 'remove_us'):.0f} us where FAISS's IndexIDMap2 compacts its whole array"
        f" ({v(sq, 100_000, 'remove_us') / 1e3:.0f} ms at 100k,"
        f" {v(sq, 1_000_000, 'remove_us') / 1e3:.0f} ms at 1M, on the event loop: every expired candidate"
        " a lookup drops, every invalidation); FAISS's own"
        " two-stage index (IndexRefine: SQ8 prefilter + fp16 re-rank, the sketch's design) cannot remove at"
        " all (`remove_ids not implemented`). FAISS wins where it does not matter much: at 10k"
        f" ({v(sq, 10_000, 'search_cpu_p50_ms'):.1f} vs {v(hw, 10_000, 'search_cpu_p50_ms'):.1f} ms here,"
        " both well under the 3 ms embedding on an idle machine), build time, and memory"
        f" ({v(sq, 1_000_000, 'bytes_per_entry'):.0f} vs {v(hw, 1_000_000, 'bytes_per_entry'):.0f} bytes per"
        " entry: the int8 sketch is the difference, and buys the 1M speed-up over the plain float16 scan,"
        f" {v('handwritten-fp16', 1_000_000, 'search_cpu_p50_ms'):.0f} ms).",
        "",
        "usearch's HNSW is the one real rival: at 100k it searches"
        f" {v(hw, k100, cpu) / v(us, k100, cpu):.1f}x faster ({v(us, k100, cpu):.1f} vs"
        f" {v(hw, k100, cpu):.1f} ms CPU, same run; on an idle machine that is roughly 1.3 ms"
        " of a ~7 ms semantic hit), and the gap grows with size"
        f" ({v(hw, 10_000, cpu) / v(us, 10_000, cpu):.1f}x"
        " at 10k). It loses on everything else the cache needs:"
        f" it is approximate (recall@1 at 100k {v(us, k100, 'recall_paraphrase'):.3f} on real paraphrases,"
        f" {v(us, k100, 'recall_near-dup'):.3f} on near-duplicates, {v(us, k100, 'recall_novel'):.3f} on"
        " novel queries; the hand-written index: 1.000), an insert costs"
        f" {v(us, k100, 'add_us') / 1e3:.1f} ms at 100k instead of {v(hw, k100, 'add_us'):.0f} us (on the"
        " event loop, every store), and loading"
        f" 100k entries, which a replica does at every start, took {v(us, k100, 'build_s'):.0f} s instead of"
        f" {v(hw, k100, 'build_s'):.0f} s (1M: not attempted; at that rate, which only falls as the graph"
        f" grows, over {10 * v(us, k100, 'build_s') / 60:.0f} minutes); one index per partition"
        " also costs far more than a small partition's rows (the partitions line above). Worth revisiting"
        " if single partitions grow toward 1M entries, where no exact scan fits a lookup's budget.",
        "",
        "`cache_service/sync.py` (load at start, pub/sub events, periodic diff against Redis, expiry) is not"
        " what these libraries do: any of them would sit behind the same resync.",
    ]


if __name__ == "__main__":
    main()
