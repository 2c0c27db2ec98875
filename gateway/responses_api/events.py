"""A response object and the stream events that build it, from the text and calls a worker produced.

One builder serves both shapes: a non-streaming request reads `snapshot()` at the end, a streaming one sends
the events each step returns, numbered by `sequence_number`. The order is the one the SDK's
`responses.stream` reads:

    response.created, response.in_progress
    text:  output_item.added, content_part.added, output_text.delta..., output_text.done,
           content_part.done, output_item.done
    call:  output_item.added, function_call_arguments.delta, function_call_arguments.done, output_item.done
    response.completed | response.incomplete (max_output_tokens) | response.failed (an error)
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> Json:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def text_part(text: str) -> Json:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class ResponseBuilder:
    """`fields`: the request's echoed fields (model, instructions, tools, ...), see serving.py."""

    id: str
    fields: Json
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    output: list[Json] = field(default_factory=list)
    usage: Json | None = None
    error: Json | None = None
    incomplete_details: Json | None = None
    completed_at: int | None = None
    failure: Exception | None = None  # what failed the response, for a non-streaming reply
    _sequence: int = 0
    _message: Json | None = None  # the message item being streamed
    _text: list[str] = field(default_factory=list)

    def snapshot(self) -> Json:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            **self.fields,
            "output": [dict(item) for item in self.output],
            "usage": self.usage,
        }

    def _event(self, kind: str, **body: Any) -> Json:
        event = {"type": kind, "sequence_number": self._sequence, **body}
        self._sequence += 1
        return event

    def _lifecycle(self, kind: str) -> Json:
        return self._event(kind, response=self.snapshot())

    def begin(self) -> list[Json]:
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def text(self, delta: str) -> list[Json]:
        if not delta:
            return []
        events = self._open_message()
        self._text.append(delta)
        assert self._message is not None
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._message["id"],
                output_index=len(self.output) - 1,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def _open_message(self) -> list[Json]:
        if self._message is not None:
            return []
        self._message = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self.output.append(self._message)
        index = len(self.output) - 1
        return [
            self._event(
                "response.output_item.added", output_index=index, item=dict(self._message, content=[])
            ),
            self._event(
                "response.content_part.added",
                item_id=self._message["id"],
                output_index=index,
                content_index=0,
                part=text_part(""),
            ),
        ]

    def _close_message(self, status: str) -> list[Json]:
        message = self._message
        if message is None:
            return []
        self._message = None
        index = self.output.index(message)
        text = "".join(self._text)
        message["content"] = [text_part(text)]
        message["status"] = status
        return [
            self._event(
                "response.output_text.done",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._event(
                "response.content_part.done",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                part=text_part(text),
            ),
            self._event("response.output_item.done", output_index=index, item=dict(message)),
        ]

    def function_call(self, name: str, arguments: str, call_id: str | None = None) -> list[Json]:
        """A whole call (the parser hands calls over once complete): its arguments in one delta."""
        events = self._close_message("completed")
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "name": name,
            "call_id": call_id or new_id("call"),
            "arguments": "",
        }
        self.output.append(item)
        index = len(self.output) - 1
        events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        events.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            )
        )
        item.update(arguments=arguments, status="completed")
        events.append(
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=name,
                arguments=arguments,
            )
        )
        events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return events

    def finish(self, finish_reason: str | None, usage_: Json) -> list[Json]:
        """`length` (max_output_tokens, or the context) ends the response as incomplete."""
        incomplete = finish_reason == "length"
        events = [] if self.output else self._open_message()  # an empty answer is still one message
        events += self._close_message("incomplete" if incomplete else "completed")
        self.usage = usage_
        if incomplete:
            self.status = "incomplete"
            self.incomplete_details = {"reason": "max_output_tokens"}
            return [*events, self._lifecycle("response.incomplete")]
        self.status = "completed"
        self.completed_at = int(time.time())
        return [*events, self._lifecycle("response.completed")]

    def fail(self, message: str, code: str = "server_error") -> list[Json]:
        events = self._close_message("incomplete")
        self.status = "failed"
        self.error = {"code": code, "message": message}
        return [*events, self._lifecycle("response.failed")]
