"""The routing key of a request: its model and its leading content, as the gateway sees it (no tokenizer).

Requests that share a key share a worker, and so that worker's prefix cache. The key is the first
GATEWAY_ROUTING_PREFIX_CHARS characters of what the worker's prompt starts with: tools, then the system
prompt and the turns in order (chat), or the text (completions). A tenant's long system prompt fills the
key alone, so all its requests meet on one worker; a conversation's key stops changing once its start
is that long; requests sharing only a short prefix spread out, as recomputing a short prefix is cheap.
With session affinity, a request naming a `user` is keyed by that user instead.
"""

from __future__ import annotations

from common.gen import worker_pb2

SEPARATOR = "\x1e"  # between messages, so "ab" + "c" and "a" + "bc" differ
CHARS_PER_TOKEN_ID = 4  # a token-id prompt: this many key characters per id, roughly a token's text


def leading_content(request: worker_pb2.GenerateRequest, prefix_chars: int) -> str:
    kind = request.WhichOneof("prompt")
    if kind == "chat":
        parts = [request.chat.tools_json] if request.chat.tools_json else []
        size = len(parts[0]) if parts else 0
        for message in request.chat.messages:
            if size >= prefix_chars:
                break
            parts.append(f"{message.role}:{message.content}")
            size += len(parts[-1]) + 1
        return SEPARATOR.join(parts)[:prefix_chars]
    if kind == "text":
        return request.text[:prefix_chars]
    if kind == "token_ids":
        ids = request.token_ids.ids[: max(prefix_chars // CHARS_PER_TOKEN_ID, 1)]
        return "ids:" + ",".join(map(str, ids))
    return ""


def routing_key(
    request: worker_pb2.GenerateRequest, prefix_chars: int = 1024, user: str | None = None
) -> str:
    """`model` first (an adapter is served under its own model name); then the user or the content."""
    if user:
        return f"{request.model}{SEPARATOR}user:{user}"
    return f"{request.model}{SEPARATOR}{leading_content(request, prefix_chars)}"
