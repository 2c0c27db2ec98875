"""The gateway's OpenAPI schema at /openapi.json, with the request bodies the routes really validate.

The completion routes read their bodies themselves (to bound their size before parsing), so FastAPI
cannot see their models; the bodies are added here from the same pydantic models that parse them.
Fuzzers (tests/e2e/test_fuzz.py runs schemathesis) and client generators read this schema.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from gateway.embeddings import EmbeddingRequest
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.responses_api.protocol import ResponsesRequest

REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/embeddings": EmbeddingRequest,
}
REF = "#/components/schemas/{model}"


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in REQUEST_BODIES.items():
        body = model.model_json_schema(ref_template=REF)
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        }
    app.openapi_schema = schema
    return schema
