"""The work behind /v1/responses: parse, resolve previous_response_id, run the translated chat request on a
worker (the chat route's pool, request builder and tool-call parser), shape and store the response."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import TypeAdapter, ValidationError

from gateway import observability
from gateway.errors import APIError, from_grpc, invalid_request
from gateway.http_io import check_api_key, read_body, until_disconnect
from gateway.limits import RequestLimits
from gateway.protocol import validation_error
from gateway.responses import UsageTotals, dumps
from gateway.responses_api import input_items
from gateway.responses_api.events import ResponseBuilder, new_id, usage
from gateway.responses_api.protocol import FunctionChoice, InputItem, ResponsesRequest, normalize_item
from gateway.responses_api.store import ResponseStore
from gateway.responses_api.translate import to_chat_request
from gateway.routing import metrics
from gateway.semantic import scope_of
from gateway.serving import SSE_HEADERS, ClosingStreamingResponse, WorkerLost, lost_worker_error
from gateway.settings import GatewaySettings
from gateway.tool_calls import ToolCallParser, ToolPlan, plan_tools
from gateway.worker_pool import WorkerPool, WorkerStream
from gateway.worker_request import chat_request

log = logging.getLogger(__name__)

Json = dict[str, Any]
ITEMS = TypeAdapter(list[InputItem])
PROMPT_PARAM = "input"


def tenant_of(raw: Request) -> str:
    """The chat route's tenant (gateway/semantic.py): the API key's hash, "anonymous" without one. Not the
    body's `user`: a GET or DELETE carries none."""
    return scope_of(raw.headers.get("authorization"), None)


def echoed_fields(req: ResponsesRequest, stored: bool) -> Json:
    """The request's settings as the response object repeats them."""
    choice: Any = req.tool_choice
    if isinstance(choice, FunctionChoice):
        choice = choice.model_dump()
    return {
        "model": req.model,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "store": stored,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "text": {"format": req.text_format.echoed()},
        "tool_choice": choice or "auto",  # OpenAI's default, tools or not
        "tools": [tool.model_dump(exclude_none=True) for tool in req.tools],
        "truncation": "disabled",
        "user": req.user,
        "background": False,
        "reasoning": None,
    }


def event_sse(event: Json) -> str:
    return f"event: {event['type']}\ndata: {dumps(event)}\n\n"


class ResponsesServing:
    def __init__(self, settings: GatewaySettings, pool: WorkerPool, store: ResponseStore) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store

    async def create(self, raw: Request) -> Response:
        deadline = self.pool.deadline()
        check_api_key(raw, self.settings.api_key)
        body = await read_body(raw, self.settings.gateway_max_body_bytes)
        try:
            req = ResponsesRequest.model_validate_json(body, strict=True)
        except ValidationError as exc:
            raise validation_error(exc) from None
        await self.pool.check_model(req.model)
        tenant = tenant_of(raw)
        items = await self._conversation(req, tenant)
        limits = RequestLimits.from_settings(self.settings)
        chat = to_chat_request(req, items, limits, self.pool.max_model_len(req.model))
        tools = plan_tools(chat)
        fields = echoed_fields(req, req.store is not False and self.store.enabled)
        builder = ResponseBuilder(new_id("resp"), fields)
        generate = chat_request(chat, builder.id, chat.model, tools)
        stream = await until_disconnect(
            raw, self.pool.generate(generate, PROMPT_PARAM, req.user, deadline), WorkerStream.cancel
        )
        conversation = [item.model_dump(by_alias=True, exclude_none=True) for item in items]
        if req.stream:
            steps = self._steps(builder, stream, tools, tenant, conversation)
            return ClosingStreamingResponse(
                _sse(steps), stream.cancel, deadline, media_type="text/event-stream", headers=SSE_HEADERS
            )
        try:
            try:
                steps = self._steps(builder, stream, tools, tenant, conversation, raise_lost=True)
                await until_disconnect(raw, _drain(steps))
            except WorkerLost as lost:
                # Nothing was sent or stored yet: run it again from the start, as the chat route does.
                log.warning("a worker went away mid-response (%s); running the request again", lost.error)
                metrics.RETRIES.labels(metrics.model_label(stream.replica, req.model)).inc()
                stream.cancel()
                builder = ResponseBuilder(builder.id, fields, created_at=builder.created_at)
                started = self.pool.generate(generate, PROMPT_PARAM, req.user, deadline)
                stream = await until_disconnect(raw, started, WorkerStream.cancel)
                await until_disconnect(raw, _drain(self._steps(builder, stream, tools, tenant, conversation)))
        finally:
            stream.cancel()
        if builder.failure is not None:
            raise builder.failure
        return JSONResponse(builder.snapshot())

    async def _conversation(self, req: ResponsesRequest, tenant: str) -> list[Any]:
        """The stored conversation of previous_response_id (its input and output items), then this input."""
        if req.previous_response_id is None:
            return list(req.input)
        record = await self.store.get(tenant, req.previous_response_id, "previous_response_id")
        earlier = [
            normalize_item(i, item)
            for i, item in enumerate(record["conversation"] + record["response"]["output"])
        ]
        try:
            history = ITEMS.validate_python(earlier)
        except ValidationError:  # written by this gateway: only an older format could fail
            raise invalid_request(
                "previous_response_id: the stored response cannot be continued", "previous_response_id"
            ) from None
        return [*history, *req.input]

    async def _steps(
        self,
        builder: ResponseBuilder,
        stream: WorkerStream,
        tools: ToolPlan,
        tenant: str,
        conversation: list[Json],
        raise_lost: bool = False,
    ) -> AsyncIterator[list[Json]]:
        """The events of each worker chunk. The response is stored before its last event goes out, so a client
        that read it can fetch or continue it at once. A failure ends the stream with response.failed, and is
        stored; with `raise_lost`, a worker that went away raises WorkerLost instead (the caller runs it
        again)."""
        parser = ToolCallParser(tools) if tools.mode != "none" else None
        totals = UsageTotals()
        yield builder.begin()
        try:
            async for chunk in stream.chunks():
                events = builder.text(parser.feed(chunk.text) if parser else chunk.text)
                if chunk.finish_reason:
                    totals.add(chunk.usage)
                    if parser is not None:
                        rest, calls = parser.finish()
                        events += builder.text(rest)
                        for call in calls:
                            function = call["function"]
                            events += builder.function_call(
                                function["name"], function["arguments"], call["id"]
                            )
                    used = usage(totals.prompt_tokens, totals.completion_tokens, totals.cached_tokens)
                    events += builder.finish(chunk.finish_reason, used)
                    await self._save(builder, tenant, conversation)
                if events:
                    yield events
        except (grpc.aio.AioRpcError, APIError) as exc:
            if isinstance(exc, grpc.aio.AioRpcError):
                observability.WORKER_ERRORS.labels(exc.code().name).inc()
                log.warning("worker stream %s failed: %s", builder.id, exc.code().name)
            lost = lost_worker_error(exc)
            if lost is not None and raise_lost:
                raise WorkerLost(lost) from None
            error = lost or (exc if isinstance(exc, APIError) else from_grpc(exc, PROMPT_PARAM))
            events = builder.fail(error.message)
            builder.failure = error
            await self._save(builder, tenant, conversation)
            yield events

    async def _save(self, builder: ResponseBuilder, tenant: str, conversation: list[Json]) -> None:
        """A store that fails loses only the follow-ups: the answer still goes out (logged)."""
        if not builder.fields["store"]:
            return
        try:
            await self.store.put(tenant, builder.snapshot(), conversation)
        except Exception as exc:
            log.warning("response %s not stored: %s", builder.id, exc)

    async def retrieve(self, raw: Request, response_id: str) -> Json:
        check_api_key(raw, self.settings.api_key)
        record = await self.store.get(tenant_of(raw), response_id)
        return record["response"]

    async def input_items(self, raw: Request, response_id: str) -> Json:
        check_api_key(raw, self.settings.api_key)
        record = await self.store.get(tenant_of(raw), response_id)
        return input_items.page(response_id, record["conversation"], raw.query_params)

    async def delete(self, raw: Request, response_id: str) -> Json:
        check_api_key(raw, self.settings.api_key)
        await self.store.delete(tenant_of(raw), response_id)
        return {"id": response_id, "object": "response", "deleted": True}


async def _drain(steps: AsyncIterator[list[Json]]) -> None:
    async with aclosing(steps):
        async for _ in steps:
            pass


async def _sse(steps: AsyncIterator[list[Json]]) -> AsyncIterator[str]:
    """One write per worker chunk; the generator is closed however the response ends."""
    observability.OPEN_STREAMS.inc()
    completed = False
    try:
        async with aclosing(steps):
            async for events in steps:
                yield "".join(event_sse(event) for event in events)
        completed = True
    finally:
        observability.OPEN_STREAMS.dec()
        if not completed:
            observability.CLIENT_DISCONNECTS.inc()
