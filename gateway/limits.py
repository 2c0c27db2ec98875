"""Bounds on what one request may ask for, so no single request costs the stack unbounded work.

Each stop string is searched for on every generated token, every message (or prompt of a list) is
rendered and tokenized, and n x max_tokens over all prompts is the worst-case generation a request
buys; each bound comes from a GATEWAY_MAX_* setting and each refusal is a 400 in the OpenAI shape
naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from gateway.errors import invalid_request
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from gateway.protocol import ChatCompletionRequest, CompletionRequest


def _setting(name: str) -> int:
    """The default of GATEWAY_<NAME>: gateway/settings.py is the one source."""
    return GatewaySettings.model_fields[f"gateway_{name}"].default


@dataclass(frozen=True)
class RequestLimits:
    """Each bound is the GATEWAY_MAX_* setting of the same name."""

    max_stop: int = _setting("max_stop")
    max_stop_chars: int = _setting("max_stop_chars")
    max_messages: int = _setting("max_messages")
    max_prompts: int = _setting("max_prompts")
    max_prompt_chars: int = _setting("max_prompt_chars")
    max_total_tokens: int = _setting("max_total_tokens")

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> RequestLimits:
        return cls(**{f.name: getattr(settings, f"gateway_{f.name}") for f in fields(cls)})


def check_limits(
    req: ChatCompletionRequest | CompletionRequest, limits: RequestLimits, max_model_len: int | None = None
) -> None:
    """Raise a 400 APIError for the first bound the request exceeds.

    max_tokens counts as at most max_model_len when that is known (an unset one as exactly that), since
    a choice never outgrows the context.
    """
    stop = req.stop_list
    if len(stop) > limits.max_stop:
        raise invalid_request(
            f"stop: at most {limits.max_stop} stop strings are allowed, got {len(stop)}", "stop"
        )
    longest = max((len(s) for s in stop), default=0)
    if longest > limits.max_stop_chars:
        message = f"stop: each stop string may have at most {limits.max_stop_chars} characters, got {longest}"
        raise invalid_request(message, "stop")
    messages = getattr(req, "messages", None)
    if messages is not None:
        if len(messages) > limits.max_messages:
            message = f"messages: at most {limits.max_messages} messages are allowed, got {len(messages)}"
            raise invalid_request(message, "messages")
        chars, param, num_prompts = sum(len(m.text()) for m in messages), "messages", 1
    else:
        prompts = req.prompts()  # a list of prompts runs each one: all of them count
        num_prompts, param = len(prompts), "prompt"
        if num_prompts > limits.max_prompts:
            message = f"prompt: at most {limits.max_prompts} prompts are allowed in a list, got {num_prompts}"
            raise invalid_request(message, param)
        chars = sum(len(p) for p in prompts)
    if chars > limits.max_prompt_chars:
        message = f"{param}: the prompt may have at most {limits.max_prompt_chars} characters, got {chars}"
        raise invalid_request(message, param)
    choices = req.num_choices * num_prompts
    if choices == 1:
        return  # one choice is bounded by the model's context already
    asked = req.completion_limit()
    unset_as = max_model_len if asked is None else asked  # 0 (echo, max_tokens 0) counts as 0
    per_choice = asked if max_model_len is None else min(unset_as, max_model_len)
    if per_choice is not None and choices * per_choice > limits.max_total_tokens:
        param = "n" if asked is None and req.num_choices > 1 else "max_tokens"
        per_prompt = f" for each of {num_prompts} prompts" if num_prompts > 1 else ""
        message = (
            f"{param}: n x max_tokens = {req.num_choices} x {per_choice}{per_prompt} exceeds the limit of "
            f"{limits.max_total_tokens} generated tokens per request"
        )
        raise invalid_request(message, param)
