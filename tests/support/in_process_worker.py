"""The worker's gRPC servicer on a real server in the test's own process, over an engine with a scripted
runner: for tests that must look inside the worker (what its tokenizer handed out) while a real client
calls it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from common.gen import worker_pb2_grpc
from common.grpc_server import GrpcServer
from scripts.launch import free_port
from tests.engine.factories import ScriptedRunner
from tests.unit.test_async_engine import build
from worker.server.servicer import WorkerServicer


@asynccontextmanager
async def served_worker(tokenizer) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    engine = build(ScriptedRunner(), tokenizer=tokenizer)
    await engine.start()
    server = GrpcServer("llmserve.Worker")
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(engine), server.server)
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield worker_pb2_grpc.WorkerStub(channel)
    finally:
        await server.server.stop(None)
        await engine.shutdown()
