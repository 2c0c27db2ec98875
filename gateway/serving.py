"""The work behind the two completion routes: validate, ask the cache, stream from a worker, shape."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from common.gen import worker_pb2
from gateway import observability
from gateway.errors import APIError, client_details, from_grpc, worker_lost
from gateway.http_io import check_api_key, read_body, until_disconnect
from gateway.limits import RequestLimits, check_limits
from gateway.merged_stream import MergedStream
from gateway.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from gateway.responses import SSE_DONE, ChoiceState, ResponseMeta, UsageTotals, sse, usage_dict
from gateway.routing import metrics
from gateway.semantic import CacheDecision, SemanticCacheGate
from gateway.settings import GatewaySettings
from gateway.tool_calls import ToolCallParser, ToolPlan, plan_tools
from gateway.worker_pool import WorkerPool, WorkerStream
from gateway.worker_request import chat_request, completion_request

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
WRITE_GRACE_S = 5.0  # past the request's deadline, for a stream's last event to reach a client that reads


class ClosingStreamingResponse(StreamingResponse):
    """Runs `on_close` however the response ends (done, error, or client gone), so the worker call
    is cancelled at once instead of whenever the body generator is garbage collected.

    Its writes end a grace after the request's `deadline` (time.monotonic(); GATEWAY_REQUEST_TIMEOUT_S from
    its arrival), as its worker calls do: a client that stops reading but keeps its connection open would
    otherwise hold the stream, what is buffered for it and its worker's in-flight count for as long as it
    likes. The grace lets a client that reads get the deadline's error event."""

    def __init__(
        self,
        content: AsyncIterator[str],
        on_close: Callable[[], None],
        deadline: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self.on_close = on_close
        left = None if deadline is None else deadline - time.monotonic()  # on the event loop's clock below
        self.write_deadline = (
            None if left is None else asyncio.get_running_loop().time() + left + WRITE_GRACE_S
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, self._bounded(send))
        except WriteDeadlinePassed:
            log.warning("a client read nothing until its request's deadline passed; its stream is ended")
        finally:
            self.on_close()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]  # its `finally` runs now

    def _bounded(self, send: Send) -> Send:
        async def send_by_the_deadline(message: Message) -> None:
            try:
                async with asyncio.timeout_at(self.write_deadline):
                    await send(message)
            except TimeoutError:
                raise WriteDeadlinePassed from None

        return send_by_the_deadline


class WriteDeadlinePassed(Exception):
    """A write to the client waited past the request's deadline (not an OSError: Starlette would take that
    for a client that left)."""


class WorkerLost(Exception):
    """The worker running a request went away (its connection dropped, or it stalled) before the end."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def lost_worker_error(exc: grpc.aio.AioRpcError | APIError) -> APIError | None:
    """What the client is told when `exc`, ending a worker stream, means its worker went away (the process or
    connection gone, or no token for GATEWAY_STREAM_STALL_S); None for any other failure."""
    if isinstance(exc, APIError):
        return exc if exc.code == "worker_stalled" else None
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return worker_lost(client_details(exc))
    return None


@dataclass
class Generation:
    """One request's worker streams and what shaping its answer needs, streamed (_sse) or not (_collect)."""

    meta: ResponseMeta
    stream: MergedStream
    decision: CacheDecision
    n: int  # choices over all prompts
    prompt_param: str  # the parameter a prompt error names
    tools: ToolPlan | None = None


class Serving:
    def __init__(self, settings: GatewaySettings, pool: WorkerPool, cache: SemanticCacheGate) -> None:
        self.settings = settings
        self.pool = pool
        self.cache = cache

    async def _parse(self, raw: Request, model_type: type[Any]) -> Any:
        check_api_key(raw, self.settings.api_key)
        body = await read_body(raw, self.settings.gateway_max_body_bytes)
        limits = RequestLimits.from_settings(self.settings)
        req = parse_request(model_type, body, limits)
        await self.pool.check_model(req.model)
        check_limits(req, limits, self.pool.max_model_len(req.model))  # n x max_tokens, now per model
        return req

    async def chat(self, raw: Request) -> Response:
        deadline = self.pool.deadline()
        req: ChatCompletionRequest = await self._parse(raw, ChatCompletionRequest)
        meta = self._meta("chatcmpl", req, chat=True)
        tools = plan_tools(req)
        messages = [{"role": m.role, "content": m.text(), "tool_calls": m.tool_calls} for m in req.messages]
        decision = await self.cache.decide(
            raw.headers, req, await self._cache_model(req.model), messages=messages
        )
        try:
            generate = chat_request(req, meta.id, req.model, tools)
            return await self._respond(raw, req, meta, decision, [generate], "messages", deadline, tools)
        except BaseException:
            self.cache.release(decision)
            raise

    async def completions(self, raw: Request) -> Response:
        deadline = self.pool.deadline()
        req: CompletionRequest = await self._parse(raw, CompletionRequest)
        meta = self._meta("cmpl", req, chat=False)
        prompts = req.prompts()
        # Prompt logprobs are computed by the worker, never cached: such a request does not ask the cache.
        single = prompts[0] if len(prompts) == 1 and not req.echo and req.prompt_logprobs is None else None
        text_prompt = single if isinstance(single, str) else None
        decision = await self.cache.decide(
            raw.headers, req, await self._cache_model(req.model), prompt=text_prompt
        )
        try:
            if req.echo:
                detokenize = self.pool.detokenize
                texts = [p if isinstance(p, str) else await detokenize(p, req.model) for p in prompts]
                meta.echo = [text for text in texts for _ in range(req.num_choices)]
            generates = [
                completion_request(req, meta.id if len(prompts) == 1 else f"{meta.id}-{i}", req.model, prompt)
                for i, prompt in enumerate(prompts)
            ]
            return await self._respond(raw, req, meta, decision, generates, "prompt", deadline)
        except BaseException:
            self.cache.release(decision)
            raise

    async def _cache_model(self, model: str) -> str | None:
        """The model as the semantic cache keys it (an adapter with its digest: gateway/lora.py); not asked
        of the workers while the cache is off."""
        return await self.pool.lora.cache_identity(model) if self.cache.enabled else model

    @staticmethod
    def _meta(prefix: str, req: ChatCompletionRequest | CompletionRequest, chat: bool) -> ResponseMeta:
        return ResponseMeta(
            id=f"{prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=req.model,
            chat=chat,
            num_logprobs=req.num_logprobs(),
            include_usage=bool(req.stream) and req.include_usage,
            echo_logprobs=getattr(req, "echo_logprobs", False),
            prompt_logprobs=getattr(req, "prompt_logprobs", None),
        )

    async def _respond(
        self,
        raw: Request,
        req: ChatCompletionRequest | CompletionRequest,
        meta: ResponseMeta,
        decision: CacheDecision,
        generates: list[worker_pb2.GenerateRequest],
        prompt_param: str,
        deadline: float | None,
        tools: ToolPlan | None = None,
    ) -> Response:
        headers = decision.headers()
        if decision.hit is not None:
            return self._cached(meta, decision, bool(req.stream), headers)
        stream = await self._start(raw, req, generates, prompt_param, deadline)
        n = req.num_choices * len(generates)
        generation = Generation(meta, stream, decision, n, prompt_param, tools)
        if req.stream:
            body = self._sse(generation)

            def close() -> None:  # however the response ends, its body generator started or not
                stream.cancel()
                self.cache.release(decision)

            return ClosingStreamingResponse(
                body, close, deadline, media_type="text/event-stream", headers=headers | SSE_HEADERS
            )
        try:
            try:
                result = await until_disconnect(raw, self._collect(generation))
            except WorkerLost as lost:
                # Nothing was sent yet: run it again where routing sends it now (the lost worker's calls fail
                # at once, so it is skipped), within what is left of its deadline. Once only: a request that
                # itself crashed its worker takes one more down at most. A stream can't be taken back: it ends
                # in an error.
                log.warning("a worker went away mid-generation (%s); running the request again", lost.error)
                metrics.RETRIES.labels(
                    metrics.model_label(generation.stream.streams[0].replica, req.model)
                ).inc()
                generation.stream.cancel()
                generation.stream = await self._start(raw, req, generates, prompt_param, deadline)
                try:
                    result = await until_disconnect(raw, self._collect(generation))
                except WorkerLost as again:
                    raise again.error from None
        finally:
            generation.stream.cancel()
            self.cache.release(decision)
        return JSONResponse(result, headers=headers)

    async def _start(
        self,
        raw: Request,
        req: ChatCompletionRequest | CompletionRequest,
        generates: list[worker_pb2.GenerateRequest],
        prompt_param: str,
        deadline: float | None,
    ) -> MergedStream:
        """One worker call per prompt, merged, all within the request's deadline; calls already started are
        cancelled if a later one fails."""
        streams: list[WorkerStream] = []
        try:
            for generate in generates:
                started = self.pool.generate(generate, prompt_param, req.user, deadline)
                streams.append(await until_disconnect(raw, started, WorkerStream.cancel))
        except BaseException:
            for started_stream in streams:
                started_stream.cancel()
            raise
        return MergedStream(streams, req.num_choices)

    async def _collect(self, generation: Generation) -> dict[str, Any]:
        meta, stream, n, tools = generation.meta, generation.stream, generation.n, generation.tools
        choices = [ChoiceState() for _ in range(n)]
        usage = UsageTotals(choices_per_prompt=n // len(stream.streams))
        try:
            async for chunk in stream.chunks():
                state = choices[chunk.index]
                if chunk.text:
                    state.text_parts.append(chunk.text)
                if meta.num_logprobs is not None:
                    state.logprobs.extend(chunk.logprobs)
                if chunk.prompt_logprobs:
                    state.prompt_logprobs = list(chunk.prompt_logprobs)
                if chunk.finish_reason:
                    state.finish_reason = chunk.finish_reason
                    usage.add(chunk.usage, chunk.index)
        except grpc.aio.AioRpcError as exc:
            observability.WORKER_ERRORS.labels(exc.code().name).inc()
            lost = lost_worker_error(exc)
            if lost is not None:
                raise WorkerLost(lost) from None
            raise from_grpc(exc, generation.prompt_param) from None
        except APIError as exc:
            lost = lost_worker_error(exc)
            if lost is not None:
                raise WorkerLost(lost) from None
            raise
        if tools is not None and tools.mode != "none":
            for state in choices:
                parser = ToolCallParser(tools)
                content = parser.feed(state.text)
                rest, state.tool_calls = parser.finish()
                state.text_parts = [content + rest]
        if n == 1:
            self.cache.store(generation.decision, choices[0].text, choices[0].finish_reason, usage)
        return meta.full(choices, usage.as_dict())

    async def _sse(self, generation: Generation) -> AsyncIterator[str]:
        """Role chunks first (chat), then one chunk per worker chunk, the usage chunk, then [DONE].

        Events are coalesced into one write where no client could tell the difference: the role chunks
        go out with the first token (which the pool already waited for), the last token with [DONE].
        """
        meta, stream, n, tools = generation.meta, generation.stream, generation.n, generation.tools
        observability.OPEN_STREAMS.inc()
        completed = False
        try:
            pending = [sse(meta.role_chunk(index)) for index in range(n)] if meta.chat else []
            open_choices = n
            offsets = [len(text) for text in meta.echo] if meta.echo else [0] * n
            echo_pending = list(meta.echo) if meta.echo else None
            parsers = [ToolCallParser(tools) for _ in range(n)] if tools and tools.mode != "none" else None
            text_parts: list[str] = []
            usage = UsageTotals(choices_per_prompt=n // len(stream.streams))
            finish: str | None = None
            async for chunk in stream.chunks():
                finish = chunk.finish_reason or None
                prompt = list(chunk.prompt_logprobs)  # a choice's first chunk, when asked for
                if not chunk.text and finish is None and not chunk.logprobs and not prompt:
                    continue
                logprobs = meta.render_logprobs(list(chunk.logprobs), offsets[chunk.index], prompt)
                offsets[chunk.index] += sum(len(p.chosen.token) for p in chunk.logprobs)
                if finish is not None:
                    usage.add(chunk.usage, chunk.index)
                    open_choices -= 1
                if n == 1 and chunk.text:
                    text_parts.append(chunk.text)
                text = chunk.text
                if echo_pending is not None and echo_pending[chunk.index]:
                    text, echo_pending[chunk.index] = echo_pending[chunk.index] + text, ""
                if parsers is not None:
                    text = parsers[chunk.index].feed(text)
                    if finish is not None:
                        rest, calls = parsers[chunk.index].finish()
                        text += rest
                        if calls:
                            pending.append(
                                sse(meta.chunk([meta.delta_choice(chunk.index, text, None, logprobs)]))
                            )
                            pending.append(sse(meta.tool_calls_chunk(chunk.index, calls)))
                            text, logprobs = "", None
                            finish = "tool_calls" if finish == "stop" else finish
                    if not text and finish is None and not logprobs:
                        continue
                choice = meta.delta_choice(chunk.index, text, finish, logprobs)
                if prompt:
                    meta.add_prompt_logprobs(choice, prompt)
                pending.append(sse(meta.chunk([choice])))
                if open_choices > 0:
                    yield "".join(pending)
                    pending.clear()
            if meta.include_usage:
                pending.append(sse(meta.usage_chunk(usage.as_dict())))
            pending.append(SSE_DONE)
            yield "".join(pending)
            completed = True
            if n == 1:
                self.cache.store(generation.decision, "".join(text_parts), finish, usage)
        except grpc.aio.AioRpcError as exc:
            observability.WORKER_ERRORS.labels(exc.code().name).inc()
            log.warning("worker stream %s failed mid-stream: %s", meta.id, exc.code().name)
            error = lost_worker_error(exc) or from_grpc(exc, generation.prompt_param)
            yield sse(error.body())
            yield SSE_DONE
            completed = True
        except APIError as exc:  # the stream stalled (GATEWAY_STREAM_STALL_S)
            yield sse(exc.body())
            yield SSE_DONE
            completed = True
        finally:
            observability.OPEN_STREAMS.dec()
            if not completed:
                observability.CLIENT_DISCONNECTS.inc()
            stream.cancel()

    def _cached(
        self, meta: ResponseMeta, decision: CacheDecision, stream: bool, headers: dict[str, str]
    ) -> Response:
        """A semantic cache hit in the normal response shape; nothing ran, so no prompt tokens were cached."""
        hit = decision.hit
        assert hit is not None
        usage = usage_dict(hit.prompt_tokens, hit.completion_tokens, 0)
        if not stream:
            choice = ChoiceState(text_parts=[hit.text], finish_reason=hit.finish_reason)
            return JSONResponse(meta.full([choice], usage), headers=headers)
        events = []
        if meta.chat:
            events.append(sse(meta.role_chunk(0)))
        events.append(sse(meta.chunk([meta.delta_choice(0, hit.text, None, None)])))
        events.append(sse(meta.chunk([meta.delta_choice(0, "", hit.finish_reason, None)])))
        if meta.include_usage:
            events.append(sse(meta.usage_chunk(usage)))
        events.append(SSE_DONE)
        return StreamingResponse(
            _replay(events), media_type="text/event-stream", headers=headers | SSE_HEADERS
        )


async def _replay(events: list[str]) -> AsyncIterator[str]:
    """An async body (a plain iterator would be pumped through a worker thread)."""
    for event in events:
        yield event
