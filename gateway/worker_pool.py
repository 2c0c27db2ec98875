"""Worker replicas behind one gRPC client: round-robin, skipping a replica that just refused a call.

Every Generate call carries the request's deadline (GATEWAY_REQUEST_TIMEOUT_S from its arrival, over
all retries), so a request that runs too long is aborted by the worker and its KV blocks freed.
Readiness asks each replica's grpc.health, which turns off while its engine is stalled or draining.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway import observability
from gateway.errors import APIError, from_grpc, unavailable
from gateway.lora import LoraAdapters
from gateway.request_id import grpc_metadata
from services.gen import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

# round_robin: an address that resolves to several replicas (dns:///worker:50051 with scaled containers)
# spreads calls over all of them instead of pinning the first. Reconnect quickly once a worker comes
# back (gRPC's default backoff grows to two minutes).
CHANNEL_OPTIONS = [
    ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 64 << 20),
]
DOWN_FOR_S = 2.0  # a replica that refused a call is tried last for this long
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


class WorkerReplica:
    """One worker address with its channel and the time it last refused a call."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.channel = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.down_until = 0.0

    def mark_down(self) -> None:
        self.down_until = time.monotonic() + DOWN_FOR_S

    @property
    def looks_up(self) -> bool:
        return time.monotonic() >= self.down_until


class WorkerStream:
    """A started Generate call: its first chunk already arrived, so retries are over."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, first: worker_pb2.GenerateResponse, addr: str) -> None:
        self.call = call
        self.first = first
        self.addr = addr

    async def chunks(self) -> AsyncIterator[worker_pb2.GenerateResponse]:
        yield self.first
        while True:
            chunk = await self.call.read()
            if chunk is grpc.aio.EOF:
                return
            yield chunk

    def cancel(self) -> None:
        """Cancelling the call makes the worker abort the request and free its KV blocks."""
        self.call.cancel()


class WorkerPool:
    def __init__(self, addrs: list[str], request_timeout_s: float | None = None) -> None:
        if not addrs:
            raise ValueError("WORKER_ADDR names no worker")
        self.request_timeout_s = request_timeout_s
        self.replicas = [WorkerReplica(addr) for addr in addrs]
        self._turn = itertools.count()
        self.model_name: str | None = None
        self.max_model_len: int | None = None
        self.lora = LoraAdapters(self)

    def _order(self) -> list[WorkerReplica]:
        """Round-robin start, replicas that recently refused a call moved to the back."""
        start = next(self._turn) % len(self.replicas)
        rotated = self.replicas[start:] + self.replicas[:start]
        return [r for r in rotated if r.looks_up] + [r for r in rotated if not r.looks_up]

    async def generate(
        self, request: worker_pb2.GenerateRequest, prompt_param: str, lora_reloaded: bool = False
    ) -> WorkerStream:
        """Start a call on the first replica that answers; raise APIError when none can take it."""
        last_error: grpc.aio.AioRpcError | None = None
        deadline = None if self.request_timeout_s is None else time.monotonic() + self.request_timeout_s
        for replica in self._order():
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            call = replica.stub.Generate(request, timeout=timeout, metadata=grpc_metadata())
            try:
                first = await call.read()
            except grpc.aio.AioRpcError as exc:
                observability.WORKER_ERRORS.labels(exc.code().name).inc()
                if exc.code() == grpc.StatusCode.NOT_FOUND and not lora_reloaded and request.model:
                    if await self.lora.reload_on(replica, request.model):  # a worker restarted without it
                        return await self.generate(request, prompt_param, lora_reloaded=True)
                if exc.code() not in RETRYABLE:
                    raise from_grpc(exc, prompt_param) from None
                log.warning("worker %s refused a request: %s", replica.addr, exc.code().name)
                replica.mark_down()
                last_error = exc
                continue
            except BaseException:
                call.cancel()
                raise
            if first is grpc.aio.EOF:
                raise APIError(500, "The worker closed the stream without output", "server_error")
            return WorkerStream(call, first, replica.addr)
        assert last_error is not None
        raise from_grpc(last_error, prompt_param)

    async def model_info(self, timeout_s: float = 2.0) -> worker_pb2.ModelInfo:
        """The served model, from the first replica that answers; remembered for model checks."""
        last_error: grpc.aio.AioRpcError | None = None
        for replica in self._order():
            try:
                info = await replica.stub.GetModelInfo(worker_pb2.ModelInfoRequest(), timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                observability.WORKER_ERRORS.labels(exc.code().name).inc()
                replica.mark_down()
                last_error = exc
                continue
            self.model_name, self.max_model_len = info.model_name, info.max_model_len
            return info
        detail = last_error.details() if last_error else "no replica"
        raise unavailable(f"No worker is available: {detail}")

    async def ready(self, timeout_s: float = 1.0) -> worker_pb2.ModelInfo:
        """The served model, from the first replica whose grpc.health says SERVING; 503 when none does."""
        problems = []
        for replica in self._order():
            try:
                reply = await replica.health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
                if reply.status != health_pb2.HealthCheckResponse.SERVING:
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                    problems.append(f"{replica.addr}: {status}")
                    continue
                info = await replica.stub.GetModelInfo(worker_pb2.ModelInfoRequest(), timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                problems.append(f"{replica.addr}: {exc.code().name}")
                continue
            self.model_name, self.max_model_len = info.model_name, info.max_model_len
            return info
        raise unavailable(f"No worker is ready: {'; '.join(problems)}")

    async def tokenize(self, request: worker_pb2.TokenizeRequest) -> worker_pb2.TokenizeResponse:
        return await self._unary("Tokenize", request)

    async def detokenize(self, token_ids: list[int]) -> str:
        reply = await self._unary("Detokenize", worker_pb2.DetokenizeRequest(token_ids=token_ids))
        return reply.text

    async def _unary(self, method: str, request: object, timeout_s: float = 30.0) -> object:
        """A short call on the first replica that answers; a refusal of the input is a 400."""
        last_error: grpc.aio.AioRpcError | None = None
        for replica in self._order():
            try:
                return await getattr(replica.stub, method)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                observability.WORKER_ERRORS.labels(exc.code().name).inc()
                if exc.code() not in RETRYABLE:
                    raise from_grpc(exc, "prompt") from None
                replica.mark_down()
                last_error = exc
        assert last_error is not None
        raise from_grpc(last_error, "prompt")

    async def served_model_name(self) -> str:
        if self.model_name is None:
            await self.model_info()
        assert self.model_name is not None
        return self.model_name

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.channel.close()
