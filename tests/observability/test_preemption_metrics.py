"""A worker with too few KV blocks for its load preempts; its metrics still add up to the traffic sent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from common.gen import worker_pb2, worker_pb2_grpc
from tests.observability.stack import Scrape, Worker, scrape, wait_idle, worker_service
from tests.support.net import wait_for

pytestmark = pytest.mark.slow

W = "llmserve:"
NUM_REQUESTS, MAX_TOKENS = 3, 40  # ~60 tokens (4 blocks of 16) each, 8 blocks in all: someone is preempted


@pytest.fixture(scope="module")
def tight_worker(log_dir: Path) -> Iterator[Worker]:
    worker = worker_service(log_dir, "tight_worker", WORKER_NUM_KV_BLOCKS="8", WORKER_MAX_MODEL_LEN="128")
    worker.service.start()
    try:
        yield worker
    finally:
        worker.service.stop()


def generate(worker: Worker, prompt: str) -> worker_pb2.Usage:
    params = worker_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    with grpc.insecure_channel(worker.addr) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        chunks = list(stub.Generate(worker_pb2.GenerateRequest(text=prompt, params=params), timeout=120))
    assert chunks[-1].finish_reason == "length"
    return chunks[-1].usage


def delta(before: Scrape, after: Scrape, name: str) -> float:
    return after.value(W + name) - before.value(W + name)


def test_preemptions_leave_the_counters_true_to_the_traffic(tight_worker: Worker) -> None:
    before = wait_idle(tight_worker)
    prompts = [f"{uuid.uuid4().hex} Tell a story about the number {i}." for i in range(NUM_REQUESTS)]
    with ThreadPoolExecutor(NUM_REQUESTS) as pool:
        usages = list(pool.map(lambda p: generate(tight_worker, p), prompts))
    wait_for(
        lambda: delta(before, scrape(tight_worker.metrics_url), "request_success_total") == NUM_REQUESTS,
        what="the requests to be recorded",
    )
    after = wait_idle(tight_worker)
    assert delta(before, after, "num_preemptions_total") > 0, "the pool was meant to be too small"
    completion = sum(u.completion_tokens for u in usages)
    assert delta(before, after, "generation_tokens_total") == completion == NUM_REQUESTS * MAX_TOKENS
    assert delta(before, after, "time_to_first_token_seconds_count") == NUM_REQUESTS
    assert delta(before, after, "inter_token_latency_seconds_count") == completion - NUM_REQUESTS
    assert delta(before, after, "request_prompt_tokens_sum") == sum(u.prompt_tokens for u in usages)
    # As vLLM's: each request's first lookup only. The prompts share nothing; a victim resuming finds its own
    # blocks again, which is no hit.
    assert delta(before, after, "prefix_cache_queries_total") == sum(u.prompt_tokens for u in usages)
    assert delta(before, after, "prefix_cache_hits_total") == sum(u.cached_tokens for u in usages) == 0
    assert after.value(W + "num_requests_waiting") == 0
