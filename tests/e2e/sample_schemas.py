"""The structured-output model and the weather tool that the chat and Responses tests both ask for, written
once: the two APIs wrap the same function in different envelopes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Capital(BaseModel):
    city: Literal["Paris", "London", "Rome", "Berlin"]
    is_capital: bool


WEATHER_FUNCTION = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CHAT_WEATHER_TOOL = {"type": "function", "function": WEATHER_FUNCTION}  # /v1/chat/completions
RESPONSES_WEATHER_TOOL = {"type": "function", **WEATHER_FUNCTION}  # /v1/responses
