"""The set of worker replicas: WORKER_ADDR resolved now and every GATEWAY_RESOLVE_INTERVAL_S, one
replica (channel and load watcher) per address. A replica whose address is gone is retired: it takes
no new requests and its channel closes once this gateway's calls there have ended."""

from __future__ import annotations

import asyncio
import logging

from gateway.routing.addresses import WorkerTarget, resolve_all
from gateway.routing.replica import WorkerReplica

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        targets: list[WorkerTarget],
        stale_after_s: float,
        resolve_interval_s: float,
        half_life_s: float = 30.0,
    ) -> None:
        self.targets = targets
        self.stale_after_s = stale_after_s
        self.half_life_s = half_life_s
        self.resolve_interval_s = resolve_interval_s
        self.replicas: dict[str, WorkerReplica] = {}
        self.retired: list[WorkerReplica] = []
        self._resolved: dict[WorkerTarget, list[str]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def pinned_models(self) -> list[str]:
        return list(dict.fromkeys(t.model for t in self.targets if t.model))

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="worker-membership")

    async def refresh(self) -> None:
        self._resolved = await resolve_all(self.targets, self._resolved)
        wanted: dict[str, str | None] = {}
        for target, addrs in self._resolved.items():
            for addr in addrs:
                wanted.setdefault(addr, target.model)
        for addr, model in wanted.items():
            if addr not in self.replicas:
                log.info("worker %s joined%s", addr, f" (model {model})" if model else "")
                replica = WorkerReplica(addr, model, self.stale_after_s, self.half_life_s)
                replica.start()
                self.replicas[addr] = replica
        for addr in [a for a in self.replicas if a not in wanted]:
            log.info("worker %s left (no longer resolved)", addr)
            self.retired.append(self.replicas.pop(addr))
        await self._close_idle_retired()

    async def _close_idle_retired(self) -> None:
        idle = [r for r in self.retired if r.in_flight == 0]
        self.retired = [r for r in self.retired if r.in_flight > 0]
        for replica in idle:
            await replica.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.resolve_interval_s)
            try:
                await self.refresh()
            except Exception:  # membership must keep going whatever one round met
                log.exception("refreshing worker membership failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for replica in [*self.replicas.values(), *self.retired]:
            await replica.close()
        self.replicas.clear()
        self.retired.clear()
