"""OpenAI response shapes built from worker chunks: plain dicts, so each SSE chunk costs one json.dumps."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from common.gen import worker_pb2

Json = dict[str, Any]
Positions = list[worker_pb2.PositionLogprobs]

MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> str:
    return f"data: {dumps(obj)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


def _top_entry(t: worker_pb2.TokenLogprob) -> dict[str, Any]:
    return {"token": t.token, "logprob": _logprob(t.logprob), "bytes": list(t.token_bytes)}


def chat_logprobs(positions: list[worker_pb2.PositionLogprobs]) -> dict[str, Any]:
    """OpenAI chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    return {
        "content": [
            {
                "token": p.chosen.token,
                "logprob": _logprob(p.chosen.logprob),
                "bytes": list(p.chosen.token_bytes),
                "top_logprobs": [_top_entry(t) for t in p.top],
            }
            for p in positions
        ]
    }


def _legacy_top(p: worker_pb2.PositionLogprobs, num_top: int | None = None) -> dict[str, float]:
    """The chosen token and the top ones, as OpenAI's legacy `logprobs: k` ("up to k + 1 elements") and
    vLLM's: with k = 0 the chosen token alone."""
    top = {p.chosen.token: _logprob(p.chosen.logprob)}
    for t in p.top[:num_top]:
        top.setdefault(t.token, _logprob(t.logprob))
    return top


def completion_logprobs(positions: list[worker_pb2.PositionLogprobs], text_offset: int) -> dict[str, Any]:
    """Legacy completions shape; `text_offset` is where the first token starts in the completion text."""
    offsets = []
    for p in positions:
        offsets.append(text_offset)
        text_offset += len(p.chosen.token)
    return {
        "tokens": [p.chosen.token for p in positions],
        "token_logprobs": [_logprob(p.chosen.logprob) for p in positions],
        "top_logprobs": [_legacy_top(p) for p in positions],
        "text_offset": offsets,
    }


def echo_logprobs(prompt: Positions, num_top: int) -> dict[str, Any]:
    """The prompt's part of legacy logprobs with `echo` (as OpenAI's): the first token has no logprob."""
    out = completion_logprobs(prompt, 0)
    out["token_logprobs"][:1] = [None]
    out["top_logprobs"] = [None] + [_legacy_top(p, num_top) for p in prompt[1:]]
    return out


def _ranked(t: worker_pb2.TokenLogprob) -> dict[str, Any]:
    return {"logprob": _logprob(t.logprob), "rank": t.rank, "decoded_token": t.token}


def prompt_logprobs(prompt: Positions, num_top: int) -> list[dict[str, Any] | None] | None:
    """vLLM's shape: None for the first prompt token, then {token id: {logprob, rank, decoded_token}} for
    the prompt token and the top `num_top` (num_top entries when the prompt token is among them, else +1)."""
    if not prompt:
        return None
    out: list[dict[str, Any] | None] = [None]
    for p in prompt[1:]:
        entry = {str(p.chosen.token_id): _ranked(p.chosen)}
        for t in p.top[:num_top]:
            entry.setdefault(str(t.token_id), _ranked(t))
        out.append(entry)
    return out


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text_parts: list[str] = field(default_factory=list)
    logprobs: list[worker_pb2.PositionLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # parsed from the text, OpenAI shape
    prompt_logprobs: list[worker_pb2.PositionLogprobs] = field(default_factory=list)  # every prompt position

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


@dataclass
class UsageTotals:
    """Usage summed over choices: each prompt counts once (n choices share it), completions add up."""

    completion_tokens: int = 0
    choices_per_prompt: int = 1
    prompts: dict[int, tuple[int, int]] = field(default_factory=dict)  # prompt -> (tokens, cached)

    def add(self, usage: worker_pb2.Usage, index: int = 0) -> None:
        """`index`: the choice's index; with a list of prompts, choices are numbered prompt by prompt."""
        group = index // self.choices_per_prompt
        tokens, cached = self.prompts.get(group, (0, 0))
        self.prompts[group] = (max(tokens, usage.prompt_tokens), max(cached, usage.cached_tokens))
        self.completion_tokens += usage.completion_tokens

    @property
    def prompt_tokens(self) -> int:
        return sum(tokens for tokens, _ in self.prompts.values())

    @property
    def cached_tokens(self) -> int:
        return sum(cached for _, cached in self.prompts.values())

    def as_dict(self) -> dict[str, Any]:
        return usage_dict(self.prompt_tokens, self.completion_tokens, self.cached_tokens)


@dataclass
class ResponseMeta:
    """The fields every response and chunk of one request repeats."""

    id: str
    created: int
    model: str
    chat: bool
    num_logprobs: int | None
    include_usage: bool = False
    echo: list[str] | None = None  # completions with echo: each choice's prompt text, put before its output
    echo_logprobs: bool = False  # completions with echo and logprobs: the prompt's tokens lead the logprobs
    prompt_logprobs: int | None = None  # completions: vLLM's `prompt_logprobs` field, with this many top ones

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,  # OpenAI's key; null, as vLLM sends it
            "choices": choices,
        }
        if self.include_usage:
            out["usage"] = None
        return out

    def role_chunk(self, index: int) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        return self.chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def render_logprobs(self, positions: Positions, offset: int, prompt: Positions = ()) -> Json | None:
        """`prompt`: the prompt's positions, on a choice's first chunk when they were asked for."""
        if self.num_logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(positions)
        out = completion_logprobs(positions, offset)
        if self.echo_logprobs and prompt:
            head = echo_logprobs(prompt, self.num_logprobs)
            out = {key: head[key] + values for key, values in out.items()}
        return out

    def add_prompt_logprobs(self, choice: Json, prompt: Positions) -> Json:
        if self.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(prompt, self.prompt_logprobs)
        return choice

    def delta_choice(self, index: int, text: str, finish: str | None, logprobs: Json | None) -> Json:
        if self.chat:
            delta = {"content": text} if text or finish is None else {}
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def tool_calls_chunk(self, index: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
        """Each call whole in one delta (id, name and all the arguments): the SDK accumulates either way."""
        deltas = [{"index": i, **call} for i, call in enumerate(calls)]
        return self.chunk(
            [{"index": index, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}]
        )

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        out = self.chunk([])
        out["usage"] = usage
        return out

    def full(self, choices: list[ChoiceState], usage: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming response from every choice's accumulated output."""
        rendered = []
        for index, state in enumerate(choices):
            choice: dict[str, Any] = {"index": index}
            finish = state.finish_reason
            if self.chat:
                choice["message"] = {"role": "assistant", "content": state.text}
                if state.tool_calls:
                    choice["message"] = {"role": "assistant", "content": state.text or None}
                    choice["message"]["tool_calls"] = state.tool_calls
                    finish = "tool_calls" if finish == "stop" else finish
            else:
                prefix = self.echo[index] if self.echo else ""
                choice["text"] = prefix + state.text
            offset = 0 if self.chat else len(self.echo[index]) if self.echo else 0
            choice["logprobs"] = self.render_logprobs(state.logprobs, offset, state.prompt_logprobs)
            choice["finish_reason"] = finish
            rendered.append(self.add_prompt_logprobs(choice, state.prompt_logprobs))
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": rendered,
            "usage": usage,
        }
