"""Latency of the semantic cache: lookups through the real gRPC service (real embedding, real Redis) with 1k,
10k and 100k entries, the first lookup of a fresh gateway client, and a hit vs a miss end to end through the
gateway (worker + gateway + cache service as real processes).

Bulk entries go into Redis directly, in the service's own layout, with random unit embeddings (all in the
lookups' partition: the worst case for the matmul); a handful of real entries are stored through gRPC so that
paraphrase lookups are real similarity hits. The service is started after the bulk load, so it also measures
how long a replica takes to load its index from Redis.

    .venv/bin/python -m bench.cache_latency [--write-docs] [--sizes 1000,100000x100] [--no-gateway]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.report import model_section, publish
from cache_service.embedder import EMBEDDING_BACKENDS, EMBEDDING_DTYPES, resolve_backend, resolve_dtype
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, EMBEDDING_MODELS
from cache_service.keys import parse_key
from cache_service.server import limit_blas_threads
from cache_service.store import entry_key, scope_key
from common.gen import cache_pb2, cache_pb2_grpc
from gateway.cache_client import SemanticCacheClient, build_cache_key
from scripts import launch

MODEL = launch.MODEL_NAME
E2E_ROUNDS = 10  # each stored question and its rewording asked this many times: 100 semantic hits
SCOPE = "bench-tenant"
GREEDY = {"temperature": 0.0, "max_tokens": 32}
REAL = [
    ("How do I reset my password?", "What is the way to reset my password?"),
    ("What is the capital of France?", "Tell me the capital of France."),
    ("How do I delete my account?", "What is the way to delete my account?"),
    ("What is the boiling point of water?", "What's the boiling point of water"),
    ("How do I cancel my subscription?", "What is the way to cancel my subscription?"),
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by whom?"),
    ("How do I clear my browser cache?", "What is the way to clear my browser cache?"),
    ("How do I brew green tea?", "What is the way to brew green tea?"),
]
# Multi-turn: the earlier turns retyped (canonical-equal), the last question reworded.
CONVERSATIONS = [
    (
        ["What is the population of Tokyo?", "About 14 million.", "Is it the largest city in Japan?"],
        ["what's the population of tokyo", "About 14 million.", "Is it Japan's largest city?"],
    ),
    (
        ["Where can I buy train tickets to Paris?", "At the station or online.", "How much do they cost?"],
        [
            "where can i buy train tickets to Paris",
            "At the station or online.",
            "How much do the tickets cost?",
        ],
    ),
]
MISSES = [f"Tell me something interesting about topic number {i} in astronomy" for i in range(40)]


def unseen(text: str, round_no: int) -> str:
    """`text` with trailing spaces (a different number each round): the model reads the same pieces and the
    canonical key is the same, but the service has never seen the string, so its vector is not remembered
    and the hit pays the forward pass a new rewording pays (a repeated string would skip it: the batcher's
    memo)."""
    return text + " " * (round_no + 1)


def chat_key(question: str, scope: str = SCOPE) -> cache_pb2.CacheKey:
    key = build_cache_key(MODEL, scope, messages=[{"role": "user", "content": question}], params=GREEDY)
    assert key is not None
    return key


def scope_partition(scope: str) -> str:
    return parse_key(chat_key("x", scope)).partition


def bulk_load(r: redis.Redis, n: int, tenants: int = 1, seed: int = 0, dim: int = 384) -> None:
    """n entries with random unit embeddings (the service's Redis layout), spread over `tenants` scopes; the
    first scope is the lookups' own, so with tenants=1 every entry is in the partition a lookup scans."""
    rng = np.random.default_rng(seed)
    scopes = [SCOPE] + [f"other-tenant-{i}" for i in range(1, tenants)]
    parts = [scope_partition(s) for s in scopes]
    batch = 5000
    for start in range(0, n, batch):
        vecs = rng.normal(size=(min(batch, n - start), dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        pipe = r.pipeline(transaction=False)
        for j, v in enumerate(vecs):
            entry_id = f"bulk{start + j:08d}"
            t = (start + j) % tenants
            pipe.hset(
                entry_key(entry_id),
                mapping={
                    "q": f"synthetic question {start + j}",
                    "emb": v.tobytes(),
                    "resp": "synthetic",
                    "fr": "stop",
                    "pt": 1,
                    "ct": 1,
                    "model": MODEL,
                    "scope": scopes[t],
                    "part": parts[t],
                    "created": "0",
                    "hits": 0,
                },
            )
            pipe.expire(entry_key(entry_id), 3600)
            pipe.sadd(scope_key(scopes[t]), entry_id)
        pipe.execute()


def service_sums(metrics_url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the service's own lookup and embedding histograms."""
    out = {"lookup": (0.0, 0.0), "embedding": (0.0, 0.0)}
    names = {"llmserve_cache_lookup_seconds": "lookup", "llmserve_cache_embedding_seconds": "embedding"}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=5).text):
        if family.name in names:
            total = next(x.value for x in family.samples if x.name.endswith("_sum"))
            count = next(x.value for x in family.samples if x.name.endswith("_count"))
            out[names[family.name]] = (total, count)
    return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1000.0


def timed_lookups(
    stub: cache_pb2_grpc.SemanticCacheStub, questions: list[str], rounds: int, expect_hit: bool
) -> list[float]:
    out: list[float] = []
    for r in range(rounds):
        for q in questions:
            req = cache_pb2.LookupRequest(key=chat_key(unseen(q, r)))
            t = time.perf_counter()
            resp = stub.Lookup(req, timeout=5)
            out.append(time.perf_counter() - t)
            if resp.hit != expect_hit:
                raise AssertionError(f"{q!r}: expected hit={expect_hit}, got {resp.hit}")
    return out


async def cold_client_lookups(addr: str, n: int) -> list[float]:
    """First lookup of a brand-new gateway client (channel connect included), an exact hit."""
    out = []
    for _ in range(n):
        client = SemanticCacheClient(addr, timeout_s=5.0)
        t = time.perf_counter()
        hit = await client.lookup(chat_key(REAL[0][0]))
        out.append(time.perf_counter() - t)
        await client.close()
        assert hit is not None
    return out


def measure_size(
    n: int, tenants: int, redis_url: str, tmp: Path, rows: list[str], embedder: dict[str, str]
) -> str:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    bulk_load(r, n, tenants, dim=EMBEDDING_MODELS[embedder["CACHE_EMBEDDING_MODEL"]].dim)
    service = launch.cache_service("cache", tmp, redis_url, **embedder)
    addr, metrics_url = service.addr, launch.metrics_url(service, "CACHE_METRICS_PORT")
    try:
        startup = service.start(timeout_s=300).startup_s
        with grpc.insecure_channel(addr) as ch:
            stub = cache_pb2_grpc.SemanticCacheStub(ch)
            for stored, _ in REAL:
                stub.Store(
                    cache_pb2.StoreRequest(key=chat_key(stored), response="an answer", finish_reason="stop"),
                    timeout=30,
                )
            for _, p in REAL:  # warm-up, texts not asked again (hit or not: swapped case reads differently)
                stub.Lookup(cache_pb2.LookupRequest(key=chat_key(p.swapcase())), timeout=5)
            before = service_sums(metrics_url)
            semantic = timed_lookups(stub, [p for _, p in REAL], 25, True)
            after = service_sums(metrics_url)
            exact = timed_lookups(stub, [s for s, _ in REAL], 25, True)
            miss = timed_lookups(stub, MISSES, 5, False)
            entries = stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5).entries
        cold = asyncio.run(cold_client_lookups(addr, 20))
    finally:
        service.stop()
    where = f"{entries:,} in {tenants} tenant{'s' if tenants > 1 else ''}"
    inside = {k: (after[k][0] - before[k][0]) / max(after[k][1] - before[k][1], 1) * 1000 for k in after}
    rows.append(
        f"| {where} | {pct(semantic, 50):.2f} / {pct(semantic, 99):.2f} | {pct(miss, 50):.2f} / "
        f"{pct(miss, 99):.2f} | {pct(exact, 50):.2f} / {pct(exact, 99):.2f} | {pct(cold, 50):.2f} / "
        f"{max(cold) * 1000:.2f} | {inside['lookup']:.2f} / {inside['embedding']:.2f} | {startup:.1f} |"
    )
    print(rows[-1], flush=True)
    return addr


def gateway_e2e(redis_url: str, tmp: Path, embedder: dict[str, str]) -> list[str]:
    """Hit vs miss through the gateway: each question asked twice (miss, then hit), greedy, 32 tokens max."""
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    started: list[launch.Service] = []
    try:
        cache = launch.start_cache_service(
            "cache-e2e",
            tmp,
            redis_url,
            CACHE_METRICS_PORT="0",
            **embedder,
        )
        started.append(cache)
        worker = launch.start_worker("worker", tmp, WORKER_MAX_NUM_SEQS="8", **launch.stack_default_threads())
        started.append(worker)
        gateway = launch.start_gateway(
            "gateway", tmp, worker.addr, ready=True, CACHE_ENABLED="true", CACHE_ADDR=cache.addr
        )
        started.append(gateway)
        base = gateway.addr
        miss_t: list[float] = []
        hit_t: list[float] = []
        single_t: list[float] = []
        conv_t: list[float] = []
        with httpx.Client(base_url=base, timeout=120) as http:

            def ask(q: str | list[str], expected: str) -> float:
                turns = [q] if isinstance(q, str) else q
                messages = [
                    {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)
                ]
                body = {"model": MODEL, "messages": messages, **GREEDY}
                for _ in range(20):  # a hit may wait for the background store of the miss to land
                    t = time.perf_counter()
                    resp = http.post("/v1/chat/completions", json=body)
                    elapsed = time.perf_counter() - t
                    resp.raise_for_status()
                    if resp.headers.get("x-semantic-cache") == expected:
                        return elapsed
                    if expected == "miss":
                        break
                    time.sleep(0.25)
                got = resp.headers.get("x-semantic-cache")
                raise AssertionError(f"{q!r}: expected {expected}, got {got}")

            pairs: list[tuple[str | list[str], str | list[str]]] = [*REAL, *CONVERSATIONS]
            for question, _ in pairs:
                miss_t.append(ask(question, "miss"))
                ask(question, "hit")  # waits for the store; not timed
            for r in range(E2E_ROUNDS):
                for question, paraphrase in pairs:
                    hit_t.append(ask(question, "hit"))
                    if isinstance(paraphrase, str):
                        single_t.append(ask(unseen(paraphrase, r), "hit"))
                    else:
                        conv_t.append(ask([*paraphrase[:-1], unseen(paraphrase[-1], r)], "hit"))
    finally:
        for service in reversed(started):
            service.stop()
    sem_t = single_t + conv_t
    m_hit, m_miss, m_sem = statistics.median(hit_t), statistics.median(miss_t), statistics.median(sem_t)

    def row(path: str, times: list[float]) -> str:
        return f"| {path} | {len(times)} | {statistics.median(times) * 1000:.1f} | {pct(times, 99):.1f} |"

    return [
        "| path | requests | p50 ms | p99 ms |",
        "| --- | --- | --- | --- |",
        row("exact hit (gateway -> cache service)", hit_t),
        row("semantic hit, all (a rewording: embedding + vetoes)", sem_t),
        row("semantic hit, one question", single_t),
        row("semantic hit, a conversation (earlier turns canonical-equal, the last one reworded)", conv_t),
        row("cache miss (gateway -> cache -> worker, <= 32 tokens)", miss_t),
        "",
        f"At the median a semantic hit is answered {m_miss / m_sem:.0f}x faster than a miss, an exact hit "
        f"{m_miss / m_hit:.0f}x (same run, same questions).",
    ]


def scan_only(sizes: list[int]) -> list[str]:
    """The service's index search alone (int8 sketch or float16 scan, candidates re-scored in float32), in
    process, with the service's thread settings: where the time goes."""
    from cache_service.index import VectorIndex, default_scan_threads

    limit_blas_threads()
    rng = np.random.default_rng(1)
    out = []
    for n in sizes:
        index = VectorIndex(384, scan_threads=default_scan_threads())
        rows = rng.normal(size=(n, 384)).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        for i, row in enumerate(rows):
            index.add(f"e{i}", "p", "s", row, "")
        index.settle(rebuild=True)  # steady state, as a service is once it serves: the int8 sketch built
        q = rows[0]
        ts = []
        for _ in range(200):
            t = time.perf_counter()
            index.search("p", q, 4, 0.8)
            ts.append(time.perf_counter() - t)
        index.close()
        out.append(f"{n:,}: p50 {pct(ts, 50):.2f} ms, p99 {pct(ts, 99):.2f} ms")
    return out


def embed_only(dtype: str, model: str, backend: str, n: int = 200) -> str:
    """The work of a semantic hit beyond the index, in process: the query's embedding pass, and the canonical
    keys and vetoes of the query against one candidate (pure Python)."""
    from cache_service.canonical import canonical_keys
    from cache_service.embedder import Embedder
    from cache_service.vetoes import veto

    embedder = Embedder(dtype=dtype, model=model, backend=backend)
    embed_t, rules_t = [], []
    for i in range(n):
        stored, question = REAL[i % len(REAL)]
        query = unseen(question, i)
        t = time.perf_counter()
        embedder.encode([query])
        embed_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        canonical_keys(query)
        veto(query, stored)
        rules_t.append(time.perf_counter() - t)
    return (
        f"embedding pass p50 {pct(embed_t, 50):.2f} ms, p99 {pct(embed_t, 99):.2f} ms; canonical keys and "
        f"vetoes p50 {pct(rules_t, 50):.2f} ms, p99 {pct(rules_t, 99):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--sizes", default="1000,10000,100000,100000x100", help="N or NxTENANTS (entries spread over tenants)"
    )
    parser.add_argument("--no-gateway", action="store_true")
    parser.add_argument(
        "--embedding-dtype", default="auto", choices=EMBEDDING_DTYPES, help="CACHE_EMBEDDING_DTYPE"
    )
    parser.add_argument(
        "--embedding-model",
        default=DEFAULT_EMBEDDING_MODEL,
        choices=sorted(EMBEDDING_MODELS),
        help="CACHE_EMBEDDING_MODEL",
    )
    parser.add_argument(
        "--embedding-backend", default="auto", choices=EMBEDDING_BACKENDS, help="CACHE_EMBEDDING_BACKEND"
    )
    args = parser.parse_args()
    embedder = {
        "CACHE_EMBEDDING_DTYPE": args.embedding_dtype,
        "CACHE_EMBEDDING_MODEL": args.embedding_model,
        "CACHE_EMBEDDING_BACKEND": args.embedding_backend,
    }
    sizes = [(int(n), int(t or 1)) for n, _, t in (s.partition("x") for s in args.sizes.split(","))]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        rservice, redis_url = launch.start_redis(tmp)
        try:
            rows = [
                "| entries | semantic hit p50 / p99 ms | miss (embed + scan) p50 / p99 ms "
                "| exact hit p50 / p99 ms | first lookup of a new client p50 / max ms "
                "| semantic hit inside the service: lookup / embedding mean ms | service start s |",
                "| --- | --- | --- | --- | --- | --- | --- |",
            ]
            for n, tenants in sizes:
                measure_size(n, tenants, redis_url, tmp, rows, embedder)
            e2e = [] if args.no_gateway else gateway_e2e(redis_url, tmp, embedder)
        finally:
            rservice.stop()
    scan = scan_only(sorted({n // t for n, t in sizes}))
    embed = embed_only(args.embedding_dtype, args.embedding_model, args.embedding_backend)
    dtype = resolve_dtype(args.embedding_dtype, args.embedding_model)
    lines = [
        f"Command: `{' '.join(['.venv/bin/python -m bench.cache_latency', *sys.argv[1:]])}` "
        f"({os.cpu_count()} CPUs, load average {load_before:.1f} at start and {os.getloadavg()[0]:.1f} at "
        "the end: other jobs share this machine; sequential lookups over one warm gRPC channel, client-side "
        "time; 200 semantic hits, 200 exact hits and 200 misses per size).",
        "",
        *rows,
        "",
        "Index search alone (int8 sketch from 4k rows, else float16; re-scored in float32; in process): "
        + "; ".join(scan)
        + ".",
        f"Model work of one semantic hit, in process, interleaved, embedder {args.embedding_model} "
        f"{dtype} on {resolve_backend(args.embedding_backend, dtype)} ({embed}).",
    ]
    if e2e:
        lines += ["", "End to end through the gateway (non-streaming chat completions, greedy):", "", *e2e]
    section, title = model_section("cache-latency", "Semantic cache latency", args.embedding_model)
    publish(section, [title, "", *lines], args.write_docs)


if __name__ == "__main__":
    main()
