"""Prometheus metrics of the cache service (prefix llmserve_cache_), over HTTP on CACHE_METRICS_PORT."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from cache_service.artifacts import Artifact
from cache_service.batcher import EMBEDDING, KINDS, LOOKUP, BatchStats
from common.prometheus import init_labels  # also: no _created series

METHODS = ("Lookup", "Store", "Invalidate")  # the SemanticCache RPCs that can fail
# Fine below 25 ms (a lookup, a short text's pass), then up to a minute: a pass of a full batch of long
# /v1/embeddings inputs takes seconds on a CPU, and a lookup queued behind it waits as long.
_LATENCY_BUCKETS = (
    *(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0),
    *(2.5, 5.0, 10.0, 30.0, 60.0),
)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.lookups = Counter("llmserve_cache_lookups", "Lookups received.", registry=r)
        self.hits = Counter("llmserve_cache_hits", "Lookups answered from the cache.", ["kind"], registry=r)
        self.misses = Counter("llmserve_cache_misses", "Lookups not answered.", registry=r)
        self.stores = Counter("llmserve_cache_stores", "Entries stored.", registry=r)
        self.veto_rejections = Counter(
            "llmserve_cache_veto_rejections", "Candidate hits refused by a veto.", registry=r
        )
        self.stale_candidates = Counter(
            "llmserve_cache_stale_candidates",
            "Candidates whose entry had expired or was removed.",
            registry=r,
        )
        self.errors = Counter(
            "llmserve_cache_errors",
            "Requests that failed in the service (UNAVAILABLE: Redis away; INTERNAL); not malformed ones.",
            ["method"],
            registry=r,
        )
        self.invalid_requests = Counter(
            "llmserve_cache_invalid_requests",
            "Requests refused as malformed (INVALID_ARGUMENT): the client's mistake, not the service's.",
            ["method"],
            registry=r,
        )
        init_labels(self.hits, ("exact", "canonical", "semantic"))  # exported at 0 before the first hit
        init_labels(self.errors, METHODS)
        init_labels(self.invalid_requests, METHODS)
        self.entries = Gauge("llmserve_cache_entries", "Entries in this replica's vector index.", registry=r)
        self.embedding_seconds = Histogram(
            "llmserve_cache_embedding_seconds",
            "Time of one forward pass of the embedding model.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.embedding_batch_size = Histogram(
            "llmserve_cache_embedding_batch_size",
            "Inputs per forward pass of the embedding model (both kinds).",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.embedding_inputs = Counter(
            "llmserve_cache_embedding_inputs",
            "Inputs run through the embedding model, by kind: lookup (a text a lookup or a store embeds) or "
            "embedding (an input of /v1/embeddings).",
            ["kind"],
            registry=r,
        )
        self.embedding_batches = Counter(
            "llmserve_cache_embedding_batches",
            "Forward passes of the embedding model, by what they served: lookup, embedding or mixed (both).",
            ["mix"],
            registry=r,
        )
        self.embedding_memo_hits = Counter(
            "llmserve_cache_embedding_memo_hits",
            "Texts whose vector was remembered from a recent pass (no forward pass).",
            registry=r,
        )
        init_labels(self.embedding_inputs, KINDS)
        init_labels(self.embedding_batches, (*KINDS, "mixed"))
        self.lookup_seconds = Histogram(
            "llmserve_cache_lookup_seconds",
            "Lookup latency inside the service.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.artifact_info = Gauge(
            "llmserve_cache_artifact_info",
            "The data files the cache decides with (cache_service/artifacts.json), each at 1: its format and "
            "the first 12 hex digits of its sha256, so a fleet's replicas can be seen to run the same ones.",
            ["artifact", "format", "sha256"],
            registry=r,
        )

    def on_artifacts(self, artifacts: Iterable[Artifact]) -> None:
        for a in artifacts:
            self.artifact_info.labels(artifact=a.name, format=str(a.format), sha256=a.sha256[:12]).set(1)

    def on_embedding_batch(self, stats: BatchStats) -> None:
        self.embedding_seconds.observe(stats.seconds)
        self.embedding_batch_size.observe(stats.lookups + stats.embeddings)
        self.embedding_inputs.labels(kind=LOOKUP).inc(stats.lookups)
        self.embedding_inputs.labels(kind=EMBEDDING).inc(stats.embeddings)
        self.embedding_batches.labels(mix=stats.mix).inc()

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
