"""The workers behind this gateway, per model: membership, routing, and the calls to them.

Each Generate call goes to the worker the router picks (gateway/routing/: cache-aware by the request's
leading content, bounded by the load the workers report over WatchLoad). A worker that refuses the call,
dies, or stops reporting before the first chunk arrives is passed over and the request tried on the next
one; nothing reached the client yet. Every call carries the request's deadline
(GATEWAY_REQUEST_TIMEOUT_S from its arrival, over all retries), so a request that runs too long is aborted
by the worker and its KV blocks freed; a stream that goes GATEWAY_STREAM_STALL_S without a chunk from a
worker that stopped reporting (or whose engine stalled) ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import grpc
from grpc_health.v1 import health_pb2

from common.gen import worker_pb2
from gateway import observability
from gateway.errors import APIError, from_grpc, model_not_found, unavailable
from gateway.lora import LoraAdapters
from gateway.observability import STALLED
from gateway.request_id import grpc_metadata
from gateway.routing import metrics
from gateway.routing.addresses import parse_worker_addr
from gateway.routing.config import RoutingConfig
from gateway.routing.decay import DecayedShares
from gateway.routing.key import routing_key
from gateway.routing.membership import Membership
from gateway.routing.replica import WorkerReplica
from gateway.routing.router import Router

log = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
HOT_SHARE_MIN_REQUESTS = 16  # a key's share counts from this many recent requests on (a start is no trend)
RECENT_KEYS_REFRESH_S = 0.5  # the keys seen lately (for the bound on keys per worker) taken this often
FIRST_CHUNK_POLL_S = 0.25  # while waiting for a first chunk, look this often whether the worker went stale


class WorkerGone(Exception):
    """The worker stopped reporting while the request waited for its first chunk."""


def stream_stalled(stall_s: float) -> APIError:
    message = f"The worker stopped answering (no token for {stall_s:g} s); the request was aborted"
    return APIError(503, message, "service_unavailable", None, "worker_stalled", {"Retry-After": "1"})


class WorkerStream:
    """A started Generate call: its first chunk already arrived, so retries are over."""

    def __init__(
        self,
        call: grpc.aio.UnaryStreamCall,
        first: worker_pb2.GenerateResponse,
        replica: WorkerReplica,
        stall_s: float | None = None,
    ) -> None:
        self.call = call
        self.first = first
        self.replica = replica
        self.addr = replica.addr
        self.stall_s = stall_s
        self._released = False
        self._on_release: list[Callable[[], None]] = []

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run `callback` once when the call ends (its last chunk read, or cancelled)."""
        self._on_release.append(callback)

    async def chunks(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        """The call's chunks. After stall_s without one, the stream ends with an error unless the worker
        is still reporting a moving engine (then it is slow, not gone, and the wait goes on)."""
        read: asyncio.Future | None = None
        try:
            yield self.first
            while True:
                read = read or asyncio.ensure_future(self.call.read())
                done, _ = await asyncio.wait({read}, timeout=self.stall_s)
                if not done:
                    if self.replica.alive:
                        continue
                    log.warning("worker %s: no chunk for %.1f s; ending the stream", self.addr, self.stall_s)
                    observability.WORKER_ERRORS.labels(STALLED).inc()  # no gRPC status: the gateway ended it
                    self.cancel()
                    raise stream_stalled(self.stall_s or 0.0)
                chunk, read = read.result(), None
                if chunk is grpc.aio.EOF:
                    return
                yield chunk
        finally:
            if read is not None and not read.done():
                read.cancel()
            self._release()

    def cancel(self) -> None:
        """Cancelling the call makes the worker abort the request and free its KV blocks."""
        self.call.cancel()
        self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self.replica.in_flight -= 1
            for callback in self._on_release:
                callback()


class WorkerPool:
    def __init__(
        self,
        addrs: list[str] | str,
        request_timeout_s: float | None = None,
        routing: RoutingConfig | None = None,
    ) -> None:
        self.routing = routing or RoutingConfig()
        self.request_timeout_s = request_timeout_s
        self.membership = Membership(
            parse_worker_addr(addrs),
            self.routing.stale_after_s,
            self.routing.resolve_interval_s,
            self.routing.half_life_s,
        )
        self.router = Router(
            self.routing.policy,
            self.routing.balance,
            self.routing.slack,
            self.routing.hot_key_requests,
            self.routing.hot_share,
            self.routing.key_balance,
        )
        self.key_calls: Counter[str] = Counter()  # routing key -> this gateway's calls of it, open now
        self.key_shares = DecayedShares(self.routing.half_life_s)  # routing key -> its recent requests here
        self._recent: dict[str, float] = {}  # the keys seen lately and their shares, as of _recent_at
        self._recent_at = float("-inf")
        self._started: asyncio.Task[None] | None = None
        self.lora = LoraAdapters(self)

    async def start(self) -> None:
        """Resolve WORKER_ADDR and start the load watchers (once; every call below does it if needed)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self.membership.start())
        await asyncio.shield(self._started)

    @property
    def replicas(self) -> list[WorkerReplica]:
        return list(self.membership.replicas.values())

    def replicas_for(self, model: str | None) -> list[WorkerReplica]:
        """Replicas serving `model` (any when empty; an adapter's base model for a LoRA adapter), plus those
        whose model is not known yet."""
        if not model:
            return self.replicas
        model = self.lora.parent_of(model) or model
        return [r for r in self.replicas if r.model in (model, None)]

    def served_models(self) -> list[str]:
        """Models of the fleet: those pinned in WORKER_ADDR, then those the workers report, in order."""
        found = self.membership.pinned_models + [r.model for r in self.replicas if r.model]
        return list(dict.fromkeys(found))

    # ---- generation ---------------------------------------------------------------------------------
    def deadline(self) -> float | None:
        """A request's deadline on time.monotonic(), GATEWAY_REQUEST_TIMEOUT_S from now; None: no timeout."""
        return None if self.request_timeout_s is None else time.monotonic() + self.request_timeout_s

    async def generate(
        self,
        request: worker_pb2.GenerateRequest,
        prompt_param: str,
        user: str | None = None,
        deadline: float | None = None,
    ) -> WorkerStream:
        """Start a call on the first worker in routing order that takes it; raise APIError when none can.
        `deadline`: the request's, taken at its arrival, so its every call (each prompt of a list, a run
        again after its worker went away) shares it; unset: from now."""
        await self.start()
        replicas = {r.addr: r for r in self.replicas_for(request.model)}
        if not replicas:
            raise unavailable(f"No worker serves the model {request.model!r}")
        key = routing_key(request, self.routing.prefix_chars, user if self.routing.session_affinity else None)
        self.key_shares.add(key)
        if time.monotonic() - self._recent_at >= RECENT_KEYS_REFRESH_S:  # O(keys): not on every request
            self._recent = self.key_shares.recent(at_least=HOT_SHARE_MIN_REQUESTS)
            self._recent_at = time.monotonic()
        share = self.key_shares.share(key, at_least=HOT_SHARE_MIN_REQUESTS)
        states = [r.state() for r in replicas.values()]
        order = self.router.order(key, states, self.key_calls[key], share, self._recent)
        deadline = self.deadline() if deadline is None else deadline
        last_error: APIError | None = None
        self.key_calls[key] += 1  # counted from now, so that requests of a key arriving together see it
        try:
            for attempt, addr in enumerate(order):
                if attempt:
                    metrics.RETRIES.labels(metrics.model_label(replicas[addr], request.model)).inc()
                timeout = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                try:
                    stream = await self._start_on(replicas[addr], request, prompt_param, timeout)
                except _Retry as retry:
                    last_error = retry.error
                    continue
                stream.on_release(lambda: self._drop_key(key))
                return stream
        except BaseException:
            self._drop_key(key)
            raise
        self._drop_key(key)
        assert last_error is not None
        raise last_error

    def _drop_key(self, key: str) -> None:
        self.key_calls[key] -= 1
        if self.key_calls[key] <= 0:
            del self.key_calls[key]

    async def _start_on(
        self,
        replica: WorkerReplica,
        request: worker_pb2.GenerateRequest,
        prompt_param: str,
        timeout: float | None,
        lora_reloaded: bool = False,
    ) -> WorkerStream:
        call = replica.stub.Generate(request, timeout=timeout, metadata=grpc_metadata())
        replica.in_flight += 1
        try:
            first = await _first_chunk(call, replica)
        except grpc.aio.AioRpcError as exc:
            replica.in_flight -= 1
            observability.WORKER_ERRORS.labels(exc.code().name).inc()
            if exc.code() == grpc.StatusCode.NOT_FOUND and not lora_reloaded and request.model:
                if await self.lora.reload_on(replica, request.model):  # a worker restarted without it
                    return await self._start_on(replica, request, prompt_param, timeout, lora_reloaded=True)
            if exc.code() not in RETRYABLE:
                raise from_grpc(exc, prompt_param) from None
            log.warning("worker %s refused a request: %s", replica.addr, exc.code().name)
            replica.mark_down()
            raise _Retry(from_grpc(exc, prompt_param)) from None
        except WorkerGone:
            replica.in_flight -= 1
            call.cancel()
            log.warning("worker %s stopped reporting; moving its request to another worker", replica.addr)
            raise _Retry(unavailable("A worker stopped answering")) from None
        except BaseException:
            replica.in_flight -= 1
            call.cancel()
            raise
        if first is grpc.aio.EOF:
            replica.in_flight -= 1
            raise APIError(500, "The worker closed the stream without output", "server_error")
        metrics.ROUTED.labels(metrics.model_label(replica, request.model), replica.addr).inc()
        return WorkerStream(call, first, replica, self.routing.stream_stall_s)

    # ---- models, readiness, unary calls -----------------------------------------------------------------
    async def model_info(self, timeout_s: float = 2.0, model: str | None = None) -> worker_pb2.ModelInfo:
        """A model's info, from a worker that serves it (asked now when none has answered yet)."""
        await self.start()
        for replica in self.replicas_for(model):
            if replica.info is not None and (not model or replica.info.model_name == model):
                return replica.info
        last = "no worker"
        for replica in self.replicas_for(model):
            try:
                replica.info = await replica.stub.GetModelInfo(
                    worker_pb2.ModelInfoRequest(), timeout=timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                observability.WORKER_ERRORS.labels(exc.code().name).inc()
                last = exc.code().name  # the address stays out of what clients read
                continue
            if not model or replica.info.model_name == model:
                return replica.info
        raise unavailable(f"No worker is available: {last}")

    async def models(self, timeout_s: float = 1.0) -> list[worker_pb2.ModelInfo]:
        """One info per model the fleet serves; a model none of whose workers answered is left out."""
        await self.start()
        infos = []
        for model in self.served_models() or [""]:
            try:
                infos.append(await self.model_info(timeout_s, model))
            except APIError:
                continue
        if not infos:
            raise unavailable("No worker is available")
        return list({info.model_name: info for info in infos}.values())

    async def check_model(self, model: str) -> None:
        """404 unless some worker serves `model` (workers are asked first if none has said yet)."""
        await self.start()
        if model in self.served_models():
            return
        if all(r.info is None for r in self.replicas):
            await self.model_info(timeout_s=1.0)  # 503 when no worker answers at all
            if model in self.served_models():
                return
        if await self.lora.base_of(model) is not None:
            return
        raise model_not_found(model, ", ".join(self.served_models()))

    def max_model_len(self, model: str | None = None) -> int | None:
        model = model and (self.lora.parent_of(model) or model)
        for replica in self.replicas_for(model):
            if replica.info is not None and (not model or replica.info.model_name == model):
                return replica.info.max_model_len
        return None

    async def ready(self, timeout_s: float = 1.0) -> dict[str, str]:
        """Every model with a ready worker -> that worker; 503 naming each model that has none."""
        await self.start()
        ready: dict[str, str] = {}
        problems: dict[str, list[str]] = {}
        for replica in self.replicas:
            if replica.ready or await _health_serving(replica, timeout_s):
                ready.setdefault(replica.model or "", replica.addr)
            else:
                problems.setdefault(replica.model or "?", []).append(f"{replica.addr}: {_why_not(replica)}")
        missing = [m for m in self.served_models() if m not in ready]
        if missing or not ready:
            detail = "; ".join(f"{m}: {', '.join(problems.get(m, ['no worker']))}" for m in missing or ["?"])
            raise unavailable(f"No ready worker for {', '.join(missing) or 'any model'} ({detail})")
        return ready

    async def tokenize(
        self, request: worker_pb2.TokenizeRequest, model: str | None = None
    ) -> worker_pb2.TokenizeResponse:
        return await self._unary("Tokenize", request, model)

    async def detokenize(self, token_ids: list[int], model: str | None = None, param: str = "prompt") -> str:
        """`param`: what a refused id is called (an echoed prompt's, or /detokenize's `tokens`)."""
        request = worker_pb2.DetokenizeRequest(token_ids=token_ids)
        return (await self._unary("Detokenize", request, model, prompt_param=param)).text

    async def _unary(
        self,
        method: str,
        request: object,
        model: str | None,
        timeout_s: float = 30.0,
        prompt_param: str = "prompt",
    ) -> object:
        """A short call on the least loaded worker of the model that answers; a refused input is a 400."""
        await self.start()
        replicas = {r.addr: r for r in self.replicas_for(model)}
        last_error: grpc.aio.AioRpcError | None = None
        for addr in Router("cache_aware").order(model or "", [r.state() for r in replicas.values()]):
            replica = replicas[addr]
            try:
                return await getattr(replica.stub, method)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                observability.WORKER_ERRORS.labels(exc.code().name).inc()
                if exc.code() not in RETRYABLE:
                    raise from_grpc(exc, prompt_param) from None
                replica.mark_down()
                last_error = exc
        if last_error is None:
            raise unavailable(f"No worker serves the model {model!r}")
        raise from_grpc(last_error, prompt_param)

    async def served_model_name(self) -> str:
        """The first model (the only one of a single-model fleet)."""
        return (await self.model_info()).model_name

    async def close(self) -> None:
        if self._started is not None:
            await self.membership.close()


class _Retry(Exception):
    def __init__(self, error: APIError) -> None:
        self.error = error


async def _first_chunk(call: grpc.aio.UnaryStreamCall, replica: WorkerReplica) -> object:
    """The call's first chunk; WorkerGone when the worker's load reports stop meanwhile (it will not
    answer: a stopped or hung process), so the request can still go elsewhere."""
    read = asyncio.ensure_future(call.read())
    try:
        while True:
            done, _ = await asyncio.wait({read}, timeout=FIRST_CHUNK_POLL_S)
            if done:
                return read.result()
            if replica.stale:
                raise WorkerGone
    finally:
        if not read.done():
            read.cancel()


async def _health_serving(replica: WorkerReplica, timeout_s: float) -> bool:
    """Readiness of a worker that sends no load reports (an older worker): its grpc.health."""
    if not replica.watch_unsupported:
        return False
    try:
        reply = await replica.health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _why_not(replica: WorkerReplica) -> str:
    if replica.stale:
        return "load reports stopped"
    if replica.report is None:
        return "not connected"
    if replica.report.draining:
        return "draining"
    if replica.report.stalled:
        return "engine stalled"
    return "refused a call just now"
