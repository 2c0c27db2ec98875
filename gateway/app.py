"""The FastAPI app: thin routes over Serving, OpenAI-shaped errors for every failure (never a traceback)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.gen import worker_pb2
from gateway import observability, tokenization
from gateway.drain import DrainGate, DrainMiddleware
from gateway.embeddings import EmbeddingsClient, disabled, parse_embedding_request
from gateway.errors import APIError, invalid_request, model_not_found, unavailable
from gateway.http_io import ClientDisconnected, check_api_key, read_body
from gateway.lora import check_admin, lora_field, read_json_object, refuse_served_name
from gateway.observability import MetricsMiddleware
from gateway.openapi import build_openapi
from gateway.request_id import RequestIdMiddleware
from gateway.responses_api.serving import ResponsesServing
from gateway.responses_api.store import ResponseStore
from gateway.semantic import SemanticCacheGate
from gateway.serving import Serving
from gateway.settings import GatewaySettings
from gateway.worker_pool import WorkerPool

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; only ever seen in metrics


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        routing = settings.routing_config()
        pool = WorkerPool(settings.worker_addrs, settings.gateway_request_timeout_s, routing)
        cache = SemanticCacheGate(settings)
        app.state.pool = pool
        app.state.serving = Serving(settings, pool, cache)
        store = ResponseStore(settings.gateway_redis_url, settings.gateway_responses_ttl_s)
        app.state.responses = ResponsesServing(settings, pool, store)
        embeddings = (
            EmbeddingsClient(settings.cache_addr, settings.gateway_request_timeout_s)
            if settings.cache_enabled
            else None
        )
        app.state.embeddings = embeddings
        try:
            await pool.start()
            await pool.model_info(timeout_s=1.0)
        except APIError:
            log.warning(
                "no worker answered at start-up (%s); /ready stays 503 until one does", settings.worker_addr
            )
        yield
        await cache.close()
        await store.close()
        if embeddings is not None:
            await embeddings.close()
        await pool.close()

    app = FastAPI(title="llmserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    app.state.drain = DrainGate()  # gateway/__main__.py starts the drain on SIGTERM
    app.add_middleware(DrainMiddleware, gate=app.state.drain)
    app.add_middleware(MetricsMiddleware)
    if settings.cors_allow_origins:
        origins = [o.strip() for o in settings.cors_allow_origins.split(",") if o.strip()]
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Request-Id", "X-Semantic-Cache", "X-Semantic-Cache-Tier"],
        )
    app.add_middleware(RequestIdMiddleware)  # outermost: every response carries the id
    _add_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await request.app.state.serving.chat(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await request.app.state.serving.completions(request)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await request.app.state.responses.create(request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict:
        return await request.app.state.responses.retrieve(request, response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, request: Request) -> dict:
        return await request.app.state.responses.input_items(request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> dict:
        return await request.app.state.responses.delete(request, response_id)

    @app.post("/v1/embeddings")
    async def embeddings_route(request: Request) -> dict:
        check_api_key(request, settings.api_key)
        body = await read_body(request, settings.gateway_max_body_bytes)
        req = parse_embedding_request(body)
        client: EmbeddingsClient | None = request.app.state.embeddings
        if client is None:
            raise disabled()
        return await client.embed(req)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> dict:
        check_api_key(request, settings.api_key)
        body = await read_body(request, settings.gateway_max_body_bytes)
        return await tokenization.tokenize(request.app.state.pool, body)

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> dict:
        check_api_key(request, settings.api_key)
        body = await read_body(request, settings.gateway_max_body_bytes)
        return await tokenization.detokenize(request.app.state.pool, body)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        check_api_key(request, settings.api_key)
        return {"object": "list", "data": await _model_cards(request, started)}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> dict:
        check_api_key(request, settings.api_key)
        cards = await _model_cards(request, started)
        for card in cards:
            if card["id"] == model:
                return card
        raise model_not_found(model, ", ".join(card["id"] for card in cards))

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        check_admin(request, settings)
        body = await read_json_object(request, settings.gateway_max_body_bytes)
        name, path = lora_field(body, "lora_name"), lora_field(body, "lora_path")
        refuse_served_name(name, await _served_model_names(request, started))
        await request.app.state.pool.lora.load(name, path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        check_admin(request, settings)
        body = await read_json_object(request, settings.gateway_max_body_bytes)
        name = lora_field(body, "lora_name")
        await request.app.state.pool.lora.unload(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.get("/health")
    async def health() -> dict:
        """Liveness of the gateway process itself."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(request: Request) -> dict:
        """200 only while every model has a ready worker (reporting load, not draining, engine moving)
        and this gateway is not draining; the 503 names each model that has none."""
        if request.app.state.drain.draining:
            raise unavailable("The gateway is shutting down")
        ready = await request.app.state.pool.ready(timeout_s=1.0)
        return {"status": "ready", "model": next(iter(ready)), "models": list(ready)}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


async def _model_cards(request: Request, created: int) -> list[dict]:
    """Every model the fleet serves; each LoRA adapter with its `parent` (the base) and `root` (its path), as
    vLLM lists them; then the cache service's embedding model while that service answers."""
    pool: WorkerPool = request.app.state.pool
    cards = [_model_card(info, created) for info in await pool.models(timeout_s=1.0)]
    try:
        adapters = await pool.lora.listing(timeout_s=1.0)
    except APIError:  # the base models answered but no adapter listing did: their cards alone
        adapters = {}
    bases = {card["id"]: card for card in cards}
    cards += [
        {**bases[adapter.parent], "id": name, "root": adapter.path, "parent": adapter.parent}
        for name, adapter in adapters.items()
        if adapter.parent in bases
    ]
    embeddings: EmbeddingsClient | None = request.app.state.embeddings
    if embeddings is not None and (card := await embeddings.model_card(created)) is not None:
        cards.append(card)
    return cards


async def _served_model_names(request: Request, created: int) -> set[str]:
    """The names /v1/models lists that are not adapters: the base models and the embedding model (while the
    cache service answers; else it cannot be told)."""
    return {card["id"] for card in await _model_cards(request, created) if card.get("parent") is None}


def _model_card(info: worker_pb2.ModelInfo, created: int) -> dict:
    return {
        "id": info.model_name,
        "object": "model",
        "created": created,
        "owned_by": "llmserve",
        "root": info.model_name,
        "parent": None,
        "max_model_len": info.max_model_len,
        "quantization": info.quantization or "none",
    }


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(ClientDisconnected)
    async def client_gone(_: Request, __: ClientDisconnected) -> Response:
        """Counted once per request whose client left first (a stream that started counts its own)."""
        observability.CLIENT_DISCONNECTS.inc()
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        return invalid_request(f"{'.'.join(loc)}: {first['msg']}", param=loc[0] if loc else None).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), "invalid_request_error", None, code).response()

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        body = {
            "error": {"message": "Internal server error", "type": "server_error", "param": None, "code": None}
        }
        return JSONResponse(body, status_code=500)
