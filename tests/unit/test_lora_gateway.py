"""Gateway side of LoRA without processes: the semantic cache keeps adapters apart (the key's model is the
adapter's name with its digest, and the partition hashes it), and the run-time routes' gate."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from cache_service.keys import parse_key
from common.gen import worker_pb2
from gateway.cache_client import build_cache_key
from gateway.errors import APIError
from gateway.lora import LoraAdapters, check_admin, lora_field, refuse_served_name
from gateway.settings import GatewaySettings

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_the_semantic_cache_partition_differs_per_adapter():
    keys = {
        model: build_cache_key(model, "", messages=MESSAGES, params={"temperature": 0.0})
        for model in ("SmolLM2-135M-Instruct", "sql", "poet")
    }
    partitions = {parse_key(key).partition for key in keys.values()}
    assert len(partitions) == 3


def _request(authorization: str | None = None) -> Request:
    headers = [(b"authorization", authorization.encode())] if authorization else []
    return Request({"type": "http", "method": "POST", "path": "/v1/load_lora_adapter", "headers": headers})


def test_runtime_routes_are_off_by_default_and_take_the_admin_key_else_the_api_key():
    with pytest.raises(APIError) as off:
        check_admin(_request(), GatewaySettings())
    assert off.value.status == 404
    on = GatewaySettings(gateway_allow_runtime_lora_updating=True)
    check_admin(_request(), on)  # no key configured: open, as the rest of the API
    admin = GatewaySettings(gateway_allow_runtime_lora_updating=True, api_key="k", gateway_admin_key="admin")
    check_admin(_request("Bearer admin"), admin)
    for header in (None, "Bearer k"):  # the API key is not the admin key
        with pytest.raises(APIError) as refused:
            check_admin(_request(header), admin)
        assert refused.value.status == 401
    api_only = GatewaySettings(gateway_allow_runtime_lora_updating=True, api_key="k")
    check_admin(_request("Bearer k"), api_only)


def test_lora_fields_must_be_non_empty_strings():
    assert lora_field({"lora_name": " sql "}, "lora_name") == "sql"
    for body in ({}, {"lora_name": ""}, {"lora_name": 3}):
        with pytest.raises(APIError) as bad:
            lora_field(body, "lora_name")
        assert bad.value.status == 400 and bad.value.param == "lora_name"


class FakeWorker:
    """One worker's LoRA RPCs: adapters by name -> (path, digest); the digest is the path's, as files are."""

    def __init__(self, digests: dict[str, str]) -> None:
        self.digests = digests  # path -> digest of the files there
        self.loaded: dict[str, str] = {}  # name -> path

    def _list(self) -> worker_pb2.LoraAdapterList:
        adapters = [
            worker_pb2.LoraAdapter(name=n, path=p, digest=self.digests[p]) for n, p in self.loaded.items()
        ]
        return worker_pb2.LoraAdapterList(enabled=True, adapters=adapters)

    async def LoadLoraAdapter(self, request, timeout=None):  # noqa: N802 (the RPC's name)
        self.loaded[request.lora_name] = request.lora_path
        return self._list()

    async def UnloadLoraAdapter(self, request, timeout=None):  # noqa: N802
        self.loaded.pop(request.lora_name)
        return self._list()

    async def ListLoraAdapters(self, request, timeout=None):  # noqa: N802
        return self._list()


def _adapters(worker: FakeWorker) -> LoraAdapters:
    async def start() -> None:
        pass

    replica = SimpleNamespace(stub=worker, model="base", addr="fake")
    pool = SimpleNamespace(start=start, replicas=[replica], served_models=lambda: ["base"])
    return LoraAdapters(pool)


def test_cache_identity_is_the_base_name_or_the_adapter_name_with_the_digest_of_its_last_load():
    worker = FakeWorker({"/a": "aaaa", "/b": "bbbb"})
    lora = _adapters(worker)

    async def scenario() -> list[str | None]:
        seen = [await lora.cache_identity("base")]
        await lora.load("x", "/a")
        seen.append(await lora.cache_identity("x"))
        await lora.unload("x")
        await lora.load("x", "/b")
        seen.append(await lora.cache_identity("x"))  # at once, though the listing was fresh before
        worker.loaded["y"] = "/a"  # loaded through another gateway, listed with no digest
        worker.digests["/a"] = ""
        lora._known_at = float("-inf")
        seen.append(await lora.cache_identity("y"))
        return seen

    assert asyncio.run(scenario()) == ["base", "x@aaaa", "x@bbbb", None]


def test_an_adapter_may_not_take_a_served_model_name():
    refuse_served_name("sql", {"base", "all-minilm-l6-v2"})
    with pytest.raises(APIError) as refused:
        refuse_served_name("all-minilm-l6-v2", {"base", "all-minilm-l6-v2"})
    assert refused.value.status == 400 and refused.value.param == "lora_name"
