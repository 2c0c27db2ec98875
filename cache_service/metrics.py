"""Prometheus metrics of the cache service (prefix llmserve_cache_), over HTTP on CACHE_METRICS_PORT."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from common.prometheus import init_labels  # also: no _created series

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)


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
        self.errors = Counter("llmserve_cache_errors", "Requests that failed.", ["method"], registry=r)
        init_labels(self.hits, ("exact", "canonical", "semantic"))  # exported at 0 before the first hit
        init_labels(self.errors, ("Lookup", "Store", "Invalidate"))
        self.entries = Gauge("llmserve_cache_entries", "Entries in this replica's vector index.", registry=r)
        self.embedding_seconds = Histogram(
            "llmserve_cache_embedding_seconds",
            "Time of one embedding batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.embedding_batch_size = Histogram(
            "llmserve_cache_embedding_batch_size",
            "Texts per embedding batch.",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.embedding_memo_hits = Counter(
            "llmserve_cache_embedding_memo_hits",
            "Texts whose vector was remembered from a recent pass (no forward pass).",
            registry=r,
        )
        self.lookup_seconds = Histogram(
            "llmserve_cache_lookup_seconds",
            "Lookup latency inside the service.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def on_embedding_batch(self, size: int, seconds: float) -> None:
        self.embedding_seconds.observe(seconds)
        self.embedding_batch_size.observe(size)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
