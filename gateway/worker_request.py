"""OpenAI request -> worker GenerateRequest. Chat messages go to the worker as-is: it owns the template."""

from __future__ import annotations

import json
from typing import Any

from common import sampling
from common.gen import worker_pb2
from gateway.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from gateway.tool_calls import ToolPlan


def contract_values(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """The request's value of each sampling contract field (common/sampling.py) but the structured output,
    under the contract's name (None: unset, the worker applies the default). The proto and the cache
    fingerprint are both built from this."""
    values: dict[str, Any] = {name: getattr(req, name, None) for name in sampling.NUMBER_FIELDS}
    values.update(
        n=req.num_choices,
        top_k=None if req.top_k is None else max(req.top_k, 0),  # -1 and 0 both mean off
        max_tokens=req.completion_limit(),
        logprobs=req.num_logprobs(),
        prompt_logprobs=req.num_prompt_logprobs(),
        ignore_eos=bool(req.ignore_eos),
        skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        stop=req.stop_list,
        stop_token_ids=list(req.stop_token_ids or []),
        allowed_token_ids=list(req.allowed_token_ids or []),
        bad_words=list(req.bad_words or []),
        logit_bias={int(token): bias for token, bias in (req.logit_bias or {}).items()},
    )
    return values


def sampling_params(req: ChatCompletionRequest | CompletionRequest) -> worker_pb2.SamplingParams:
    """Unset fields stay unset so the engine applies the contract's defaults in one place."""
    values = contract_values(req)
    params = worker_pb2.SamplingParams(
        ignore_eos=values["ignore_eos"],
        include_stop_str_in_output=values["include_stop_str_in_output"],
        stop=values["stop"],
        stop_token_ids=values["stop_token_ids"],
        allowed_token_ids=values["allowed_token_ids"],
        bad_words=values["bad_words"],
    )
    if not values["skip_special_tokens"]:
        params.skip_special_tokens = False
    for name in sampling.NUMBER_FIELDS:
        if values[name] is not None:
            setattr(params, name, values[name])
    for token, bias in values["logit_bias"].items():
        params.logit_bias[token] = bias
    structured = structured_output(req)
    if structured is not None:
        params.structured_output.CopyFrom(structured)
    return params


def structured_output(req: ChatCompletionRequest | CompletionRequest) -> worker_pb2.StructuredOutput | None:
    """response_format or vLLM's guided_* as the worker's constraint; None for free text."""
    out = worker_pb2.StructuredOutput
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        return out(json_object=True)
    if rf is not None and rf.type == "json_schema":
        assert rf.json_schema is not None
        return out(json_schema=json.dumps(rf.json_schema.schema_ or {"type": "object"}))
    if req.guided_json is not None:
        schema = req.guided_json
        return out(json_schema=schema if isinstance(schema, str) else json.dumps(schema))
    if req.guided_regex is not None:
        return out(regex=req.guided_regex)
    if req.guided_choice is not None:
        return out(choice=worker_pb2.ChoiceList(choices=req.guided_choice))
    if req.guided_grammar is not None:
        return out(grammar=req.guided_grammar)
    return None


def chat_message(m: ChatMessage) -> worker_pb2.ChatMessage:
    calls = [
        worker_pb2.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
        for c in m.tool_calls or []
    ]
    return worker_pb2.ChatMessage(
        role=m.role, content=m.text(), name=m.name or "", tool_call_id=m.tool_call_id or "", tool_calls=calls
    )


def chat_prompt(req: Any, tools_json: str) -> worker_pb2.ChatPrompt:
    """The messages of a chat or /tokenize request with its template options, as the worker takes them."""
    return worker_pb2.ChatPrompt(
        messages=[chat_message(m) for m in req.messages],
        tools_json=tools_json,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        template_kwargs_json=json.dumps(req.chat_template_kwargs) if req.chat_template_kwargs else "",
        documents_json=json.dumps(req.documents) if req.documents else "",
    )


def chat_request(
    req: ChatCompletionRequest, request_id: str, model: str, tools: ToolPlan | None = None
) -> worker_pb2.GenerateRequest:
    """Tools are rendered unless tool_choice is none; a forced call constrains the output to its schema."""
    params = sampling_params(req)
    if tools is not None and tools.schema is not None:
        params.structured_output.CopyFrom(worker_pb2.StructuredOutput(json_schema=json.dumps(tools.schema)))
    out = worker_pb2.GenerateRequest(
        request_id=request_id,
        chat=chat_prompt(req, tools.tools_json if tools else ""),
        params=params,
        model=model,
    )
    if req.truncate_prompt_tokens is not None:
        out.truncate_prompt_tokens = req.truncate_prompt_tokens
    return out


def completion_request(
    req: CompletionRequest, request_id: str, model: str, prompt: str | list[int] | None = None
) -> worker_pb2.GenerateRequest:
    """One worker request per prompt; `prompt` picks one of a batch (default: the first)."""
    prompt = req.single_prompt() if prompt is None else prompt
    out = worker_pb2.GenerateRequest(request_id=request_id, params=sampling_params(req), model=model)
    if req.truncate_prompt_tokens is not None:
        out.truncate_prompt_tokens = req.truncate_prompt_tokens
    if isinstance(prompt, str):
        out.text = prompt
    else:
        out.token_ids.ids.extend(prompt)
    return out
