"""The gRPC servicer: a thin adapter converting proto <-> engine objects and pumping one stream per call.

No scheduling happens here. A call that is cancelled or whose connection breaks is cancelled by
gRPC; the engine stream is then closed, which aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from common import sampling
from common.gen import worker_pb2, worker_pb2_grpc
from common.logs import REQUEST_ID
from worker.engine.async_engine import AsyncEngine
from worker.engine.errors import EngineError, InvalidRequestError
from worker.engine.output_stream import TokenBatcher
from worker.engine.outputs import PromptInput, RequestOutput, TokenLogprob
from worker.engine.sampling_params import SamplingParams
from worker.server import lora_rpc
from worker.server.grpc_errors import abort_for, end_for, end_with, status_of
from worker.server.proto_inputs import chat_prompt, grammar_spec

log = logging.getLogger(__name__)


def prompt_from_proto(request: worker_pb2.GenerateRequest) -> PromptInput:
    kind = request.WhichOneof("prompt")
    if kind == "text":
        prompt = PromptInput(text=request.text)
    elif kind == "chat":
        prompt = chat_prompt(request.chat)
    elif kind == "token_ids":
        prompt = PromptInput(token_ids=list(request.token_ids.ids))
    else:
        raise InvalidRequestError("a prompt is required: set text, chat or token_ids", param="prompt")
    if request.HasField("truncate_prompt_tokens"):
        if request.truncate_prompt_tokens == 0 or request.truncate_prompt_tokens < -1:
            raise InvalidRequestError(
                "truncate_prompt_tokens must be -1 (the context length) or a positive number",
                param="truncate_prompt_tokens",
            )
        prompt.truncate_prompt_tokens = request.truncate_prompt_tokens
    return prompt


def params_from_proto(proto: worker_pb2.SamplingParams) -> SamplingParams:
    params = SamplingParams(
        ignore_eos=proto.ignore_eos,
        stop=list(proto.stop),
        stop_token_ids=list(proto.stop_token_ids),
        include_stop_str_in_output=proto.include_stop_str_in_output,
        allowed_token_ids=list(proto.allowed_token_ids),
        bad_words=list(proto.bad_words),
    )
    if proto.HasField("skip_special_tokens"):
        params.skip_special_tokens = proto.skip_special_tokens
    for name in sampling.NUMBER_FIELDS:  # optional on the wire: unset ones keep the contract's defaults
        if proto.HasField(name):
            setattr(params, name, getattr(proto, name))
    params.logit_bias = dict(proto.logit_bias)
    if proto.HasField("structured_output"):
        params.structured_output = grammar_spec(proto.structured_output)
    return params


def check_params_for_model(params: SamplingParams, vocab_size: int) -> None:
    """Refuse what the sampling contract cannot know: token ids outside the served vocabulary (they index
    the logits, so they broke the engine loop). The contract's own ranges are checked first."""
    try:
        params.validate()
    except sampling.SamplingError as exc:
        raise InvalidRequestError(str(exc), param=exc.param) from None
    token_ids = [("stop_token_ids", t) for t in params.stop_token_ids]
    token_ids += [("logit_bias", t) for t in getattr(params, "logit_bias", None) or ()]
    token_ids += [("allowed_token_ids", t) for t in params.allowed_token_ids]
    for name, token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            message = f"{name}: token id {token_id} is out of range [0, {vocab_size})"
            raise InvalidRequestError(message, param=name)


def output_to_proto(output: RequestOutput) -> worker_pb2.GenerateResponse:
    response = worker_pb2.GenerateResponse(
        request_id=output.group_id,
        index=output.index,
        text=output.text,
        token_ids=output.token_ids,
        finish_reason=output.finish_reason or "",
    )
    for position in output.logprobs or ():
        response.logprobs.add(
            chosen=_token_logprob(position.chosen), top=[_token_logprob(t) for t in position.top]
        )
    for position in output.prompt_logprobs or ():
        response.prompt_logprobs.add(
            chosen=_token_logprob(position.chosen), top=[_token_logprob(t) for t in position.top]
        )
    if output.usage is not None:
        response.usage.prompt_tokens = output.usage.prompt_tokens
        response.usage.completion_tokens = output.usage.completion_tokens
        response.usage.cached_tokens = output.usage.cached_tokens
    return response


def _token_logprob(t: TokenLogprob) -> worker_pb2.TokenLogprob:
    return worker_pb2.TokenLogprob(
        token_id=t.token_id, token=t.token, logprob=t.logprob, token_bytes=t.token_bytes, rank=t.rank
    )


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The call's gRPC deadline on the event loop's clock; None when the client set none."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return asyncio.get_running_loop().time() + remaining


LOAD_INTERVAL_S = (0.05, 0.01, 1.0)  # WatchLoad's look-for-a-change period: default, min, max
LOAD_HEARTBEAT_S = (1.0, 0.1, 10.0)  # WatchLoad sends at least this often: default, min, max


def _period(ms: int, bounds: tuple[float, float, float]) -> float:
    default, low, high = bounds
    return min(max(ms / 1000, low), high) if ms > 0 else default


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: AsyncEngine, stream_interval: int = 1) -> None:
        self.engine = engine
        self.stream_interval = stream_interval

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        """Errors end the call with a status set, never a raised abort (grpc_errors.end_with says why)."""
        try:
            stream = self._start(request, context)
        except (EngineError, ValueError) as exc:
            end_for(context, exc)
            return
        batcher = TokenBatcher(self.stream_interval)
        deadline = _deadline(context)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):  # the client's deadline, not across the yield
                        output = await anext(stream)
                except StopAsyncIteration:
                    break
                ready = batcher.push(output)
                if ready is not None:
                    yield output_to_proto(ready)
        except TimeoutError:  # the stream was closed by the timeout, which aborted the request
            end_with(context, "DEADLINE_EXCEEDED", "the request's deadline passed; it was aborted")
        except Exception as exc:
            if status_of(exc) == grpc.StatusCode.INTERNAL:
                log.exception("request %s failed", REQUEST_ID.get())
            end_for(context, exc)
        finally:
            await stream.aclose()  # a no-op when finished; otherwise aborts the request in the engine

    def _start(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[RequestOutput]:
        """The request's engine stream, not started yet; EngineError or ValueError for a bad request."""
        lora = lora_rpc.resolve_model(self.engine.lora, self.engine.model_info.model_name, request.model)
        request_id = request.request_id or uuid.uuid4().hex
        REQUEST_ID.set(dict(context.invocation_metadata() or ()).get("x-request-id", request_id))
        log.info("request %s received", request_id)
        prompt = prompt_from_proto(request)
        params = params_from_proto(request.params)
        check_params_for_model(params, self.engine.model_info.vocab_size)
        return self.engine.generate(request_id, prompt, params, lora)

    async def Abort(
        self, request: worker_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.AbortResponse:
        return worker_pb2.AbortResponse(found=await self.engine.abort(request.request_id))

    async def GetModelInfo(
        self, request: worker_pb2.ModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ModelInfo:
        info = self.engine.model_info
        return worker_pb2.ModelInfo(
            model_name=info.model_name,
            max_model_len=info.max_model_len,
            block_size=info.block_size,
            num_kv_blocks=info.num_kv_blocks,
            dtype=info.dtype,
            device=info.device,
            max_num_seqs=info.max_num_seqs,
            vocab_size=info.vocab_size,
            quantization=info.quantization,
        )

    async def Tokenize(
        self, request: worker_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.TokenizeResponse:
        # unset: with the special tokens, as Generate reads a text prompt (vLLM's default)
        add_special = not request.HasField("add_special_tokens") or request.add_special_tokens
        kind = request.WhichOneof("prompt")
        try:  # the chat's options (tools, template kwargs, documents) are read here: refused like Generate's
            if kind is None:
                raise InvalidRequestError("a prompt is required: set text or chat", param="prompt")
            prompt = chat_prompt(request.chat) if kind == "chat" else PromptInput(text=request.text)
            ids, tokens = await self.engine.tokenize(prompt, add_special)
        except EngineError as exc:  # a bad prompt, or no engine running: with its reason, like Generate
            await abort_for(context, exc)
        return worker_pb2.TokenizeResponse(
            token_ids=ids, tokens=tokens, max_model_len=self.engine.model_info.max_model_len
        )

    async def Detokenize(
        self, request: worker_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DetokenizeResponse:
        try:
            text = await self.engine.detokenize(list(request.token_ids))
        except EngineError as exc:  # a bad prompt, or no engine running: with its reason, like Generate
            await abort_for(context, exc)
        return worker_pb2.DetokenizeResponse(text=text)

    async def GetStats(
        self, request: worker_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.Stats:
        stats = self.engine.stats()
        return worker_pb2.Stats(
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            num_kv_blocks_used=stats.num_kv_blocks_used,
            num_kv_blocks_total=stats.num_kv_blocks_total,
            kv_cache_usage=stats.kv_cache_usage,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            prefix_cache_hit_rate=stats.prefix_cache_hit_rate,
            num_preemptions=stats.num_preemptions,
            num_finished=stats.num_finished,
        )

    def load_report(self) -> worker_pb2.LoadReport:
        """The engine's last published counters plus the drain and stall flags, for WatchLoad."""
        stats = self.engine.stats()
        return worker_pb2.LoadReport(
            model_name=self.engine.model_info.model_name,
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            kv_cache_usage=stats.kv_cache_usage,
            draining=self.engine.draining,
            stalled=self.engine.is_stalled,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
        )

    async def WatchLoad(
        self, request: worker_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.LoadReport]:
        """A report now, then on every change of the routing figures, and a heartbeat at least every
        heartbeat period, so a gateway can tell a quiet worker from one that stopped (SIGSTOP, a hang)."""
        interval = _period(request.interval_ms, LOAD_INTERVAL_S)
        heartbeat = _period(request.heartbeat_ms, LOAD_HEARTBEAT_S)
        loop = asyncio.get_running_loop()
        last: tuple | None = None
        sent_at = 0.0
        while True:
            try:
                report = self.load_report()
            except EngineError as exc:
                await abort_for(context, exc)
            figures = (report.num_running, report.num_waiting, report.kv_cache_usage, report.draining)
            figures += (report.stalled,)
            if figures != last or loop.time() - sent_at >= heartbeat:
                yield report
                last, sent_at = figures, loop.time()
            await asyncio.sleep(interval)

    async def LoadLoraAdapter(self, request, context: grpc.aio.ServicerContext) -> worker_pb2.LoraAdapterList:
        try:
            return await lora_rpc.load(self.engine.lora, self.engine.model_info.model_name, request)
        except EngineError as exc:
            await abort_for(context, exc)

    async def UnloadLoraAdapter(
        self, request, context: grpc.aio.ServicerContext
    ) -> worker_pb2.LoraAdapterList:
        try:
            return lora_rpc.unload(self.engine.lora, request)
        except EngineError as exc:
            await abort_for(context, exc)

    async def ListLoraAdapters(
        self, request, context: grpc.aio.ServicerContext
    ) -> worker_pb2.LoraAdapterList:
        return lora_rpc.adapter_list(self.engine.lora)
