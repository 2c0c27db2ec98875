"""GET /v1/responses/{id}/input_items: the input a stored response read (its whole conversation, without the
instructions), as OpenAI lists it: newest first unless `order=asc`, pages of `limit` after the item `after`.

Stored conversations keep no item ids, so each item's id is derived from the response id and its place in
the conversation: the same on every call, and never shared with another response's items.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import invalid_request

Json = dict[str, Any]
PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
MAX_LIMIT = 100


def listed_item(response_id: str, index: int, item: Json) -> Json:
    """One conversation item in the shape OpenAI lists input items."""
    kind = item["type"]
    out: Json = {"id": f"{PREFIXES[kind]}_{response_id.removeprefix('resp_')}_{index}", "type": kind}
    if kind == "message":
        part_type = "output_text" if item["role"] == "assistant" else "input_text"
        content = item["content"]
        texts = (
            [content]
            if isinstance(content, str)
            else [p.get("text") or p.get("refusal", "") for p in content]
        )
        parts = [
            {"type": part_type, "text": t} | ({"annotations": []} if part_type == "output_text" else {})
            for t in texts
        ]
        out |= {"role": item["role"], "content": parts}
    elif kind == "function_call":
        out |= {"call_id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
    else:
        output = item["output"]
        text = output if isinstance(output, str) else "".join(p.get("text", "") for p in output)
        out |= {"call_id": item["call_id"], "output": text}
    return out | {"status": "completed"}


def page(response_id: str, conversation: list[Json], query: Any) -> Json:
    """`query`: the request's query parameters (limit, order, after)."""
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        raise invalid_request("limit: must be an integer", "limit") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid_request(f"limit: must be between 1 and {MAX_LIMIT}", "limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("order: must be 'asc' or 'desc'", "order")
    items = [listed_item(response_id, i, item) for i, item in enumerate(conversation)]
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid_request(f"after: no input item {after!r} in this response", "after")
        items = items[ids.index(after) + 1 :]
    shown = items[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(items) > limit,
    }
