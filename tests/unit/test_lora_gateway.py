"""Gateway side of LoRA without processes: the semantic cache keeps adapters apart (the key's model is the
adapter's name, and the partition hashes it), and the run-time routes' gate."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from cache_service.keys import parse_key
from gateway.cache_client import build_cache_key
from gateway.errors import APIError
from gateway.lora import check_admin, lora_field
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
