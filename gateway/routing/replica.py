"""One worker address: its channel, the load it reports over WatchLoad, and the calls this gateway has
open there. A watcher task keeps the WatchLoad stream open and reconnects when it breaks."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from grpc_health.v1 import health_pb2_grpc

from common.gen import worker_pb2, worker_pb2_grpc
from gateway.routing import metrics
from gateway.routing.decay import Decayed
from gateway.routing.router import WorkerState

log = logging.getLogger(__name__)

# One address per channel: routing picks the replica, so gRPC's own balancing stays out (pick_first).
# Reconnect quickly once a worker comes back (gRPC's default backoff grows to two minutes).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 64 << 20),
]
DOWN_FOR_S = 2.0  # a replica that refused a call is tried last for this long
WATCH_INTERVAL_MS = 50  # how often the worker looks for a change of its load (20 wake-ups a second)
WATCH_HEARTBEAT_MS = 500  # a report at least this often: silence means the worker stopped
WATCH_RETRY_S = (0.2, 2.0)  # reconnect backoff of the watcher: first, most


class WorkerReplica:
    def __init__(
        self, addr: str, pinned_model: str | None, stale_after_s: float = 3.0, half_life_s: float = 30.0
    ) -> None:
        self.addr = addr
        self.pinned_model = pinned_model
        self.stale_after_s = stale_after_s
        self.channel = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.info: worker_pb2.ModelInfo | None = None
        self.report: worker_pb2.LoadReport | None = None  # None while the WatchLoad stream is down
        self.reported_at = 0.0
        self.watch_unsupported = False  # a worker without WatchLoad: routed on this gateway's calls only
        self.in_flight = 0  # calls this gateway has open there
        self.in_flight_at_report = 0  # ...as of the last load report
        self.recent_tokens = Decayed(half_life_s)  # prompt tokens it looked up lately, from its reports
        self.down_until = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def model(self) -> str | None:
        """The model the worker says it serves; the pinned one until it has said."""
        return self.info.model_name if self.info is not None else self.pinned_model

    def mark_down(self) -> None:
        self.down_until = time.monotonic() + DOWN_FOR_S

    @property
    def stale(self) -> bool:
        """Its WatchLoad stream is open but silent: the process stopped (SIGSTOP) or hangs."""
        return self.report is not None and time.monotonic() - self.reported_at > self.stale_after_s

    @property
    def alive(self) -> bool:
        """Reporting, and its engine moving: a stream there that is quiet is slow, not lost."""
        return self.report is not None and not self.stale and not self.report.stalled

    @property
    def load(self) -> int:
        """The last report, moved by this gateway's calls started and ended since (a report is up to
        50 ms old: a call that just ended must not count, or a worker busy with one tenant looks fuller
        than it is and that tenant's next request spills onto a worker without its prompt)."""
        if self.report is None:
            return self.in_flight
        reported = self.report.num_running + self.report.num_waiting
        return max(reported + self.in_flight - self.in_flight_at_report, self.in_flight)

    def tier(self) -> int:
        """0: takes new requests; 1: tried after those (may refuse fast); 2: last resort (may hang)."""
        if self.stale or (self.report is not None and self.report.stalled):
            return 2
        if time.monotonic() < self.down_until:
            return 1
        if self.watch_unsupported:
            return 0
        if self.report is None or self.report.draining:
            return 1
        return 0

    def state(self) -> WorkerState:
        return WorkerState(self.addr, self.load, self.tier(), self.recent_tokens.value())

    def _count_tokens(self, report: worker_pb2.LoadReport) -> None:
        """Add the prompt tokens looked up since the last report (none on the first report of a stream, or
        when the counter went back: a restarted worker)."""
        last = self.report
        if last is not None and report.prefix_cache_queries >= last.prefix_cache_queries:
            self.recent_tokens.add(report.prefix_cache_queries - last.prefix_cache_queries)

    @property
    def ready(self) -> bool:
        """Serving its model, as its reports say (a worker without WatchLoad: when it answered last)."""
        return self.info is not None and self.tier() == 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"watch-load {self.addr}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.channel.close()
        metrics.forget_worker(self.addr)

    async def _watch(self) -> None:
        delay = WATCH_RETRY_S[0]
        while True:
            try:
                await self._watch_once()
                delay = WATCH_RETRY_S[0]
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.warning("worker %s has no WatchLoad; routing it on this gateway's calls", self.addr)
                    self.watch_unsupported = True
                    return
                if self.report is not None:
                    log.warning("worker %s: load reports ended (%s)", self.addr, exc.code().name)
            self.report = None
            metrics.observe_load(self)
            await asyncio.sleep(delay)
            delay = min(delay * 2, WATCH_RETRY_S[1])

    async def _watch_once(self) -> None:
        """Follow one WatchLoad stream; while it is silent, look every half staleness period, so that the
        metrics and the log say so when the worker stops reporting."""
        self.info = await self.stub.GetModelInfo(worker_pb2.ModelInfoRequest(), timeout=5.0)
        if self.pinned_model and self.info.model_name != self.pinned_model:
            log.error(
                "worker %s serves %r, not %r as WORKER_ADDR says", self.addr, self.model, self.pinned_model
            )
        request = worker_pb2.WatchLoadRequest(interval_ms=WATCH_INTERVAL_MS, heartbeat_ms=WATCH_HEARTBEAT_MS)
        call = self.stub.WatchLoad(request)
        read: asyncio.Future | None = None
        warned = False
        try:
            while True:
                read = read or asyncio.ensure_future(call.read())
                done, _ = await asyncio.wait({read}, timeout=self.stale_after_s / 2)
                if not done:
                    if self.stale and not warned:
                        log.warning("worker %s: no load report for %.1f s", self.addr, self.stale_after_s)
                        warned = True
                    metrics.observe_load(self)
                    continue
                report, read = read.result(), None
                if report is grpc.aio.EOF:
                    return
                if self.report is None:
                    log.info("worker %s serves %s: load reports started", self.addr, report.model_name)
                self._count_tokens(report)
                self.report, self.reported_at, warned = report, time.monotonic(), False
                self.in_flight_at_report = self.in_flight
                metrics.observe_load(self)
        finally:
            if read is not None and not read.done():
                read.cancel()
            call.cancel()
