"""OpenAI request -> worker GenerateRequest. Chat messages go to the worker as-is: it owns the template."""

from __future__ import annotations

from gateway.protocol import ChatCompletionRequest, CompletionRequest
from services.gen import worker_pb2

# Request fields copied to the proto unchanged when the client set them.
_PASSTHROUGH = (
    "temperature",
    "top_p",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
)


def sampling_params(req: ChatCompletionRequest | CompletionRequest) -> worker_pb2.SamplingParams:
    """Unset fields stay unset so the engine applies the OpenAI defaults in one place."""
    params = worker_pb2.SamplingParams(n=req.num_choices, ignore_eos=bool(req.ignore_eos), stop=req.stop_list)
    for name in _PASSTHROUGH:
        value = getattr(req, name)
        if value is not None:
            setattr(params, name, value)
    if req.top_k is not None:
        params.top_k = max(req.top_k, 0)
    limit = req.completion_limit()
    if limit is not None:
        params.max_tokens = limit
    num_logprobs = req.num_logprobs()
    if num_logprobs is not None:
        params.logprobs = num_logprobs
    return params


def chat_request(req: ChatCompletionRequest, request_id: str, model: str) -> worker_pb2.GenerateRequest:
    messages = [worker_pb2.ChatMessage(role=m.role, content=m.text()) for m in req.messages]
    return worker_pb2.GenerateRequest(
        request_id=request_id,
        chat=worker_pb2.ChatPrompt(messages=messages),
        params=sampling_params(req),
        model=model,
    )


def completion_request(req: CompletionRequest, request_id: str, model: str) -> worker_pb2.GenerateRequest:
    prompt = req.single_prompt()
    out = worker_pb2.GenerateRequest(request_id=request_id, params=sampling_params(req), model=model)
    if isinstance(prompt, str):
        out.text = prompt
    else:
        out.token_ids.ids.extend(prompt)
    return out
