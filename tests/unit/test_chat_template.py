"""vLLM's two chat template options on the real tokenizer: the assistant's turn opened after the messages (the
default), not opened, or the last message, an assistant's, left open for the reply to continue."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from worker.engine.chat_template import render_chat

MODEL_DIR = "models/SmolLM2-135M-Instruct"
ASKED = [{"role": "user", "content": "Count to five"}]
STARTED = [*ASKED, {"role": "assistant", "content": "1, 2,"}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_the_default_opens_the_assistants_turn(tokenizer):
    text = render_chat(tokenizer, ASKED, None)
    assert text.endswith("Count to five<|im_end|>\n<|im_start|>assistant\n")
    unopened = render_chat(tokenizer, ASKED, None, add_generation_prompt=False)
    assert unopened.endswith("Count to five<|im_end|>\n")


def test_continue_final_message_leaves_the_assistants_message_open(tokenizer):
    text = render_chat(tokenizer, STARTED, None, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n1, 2,")
    closed = render_chat(tokenizer, STARTED, None)  # the default closes it and opens a new turn
    assert closed.endswith("1, 2,<|im_end|>\n<|im_start|>assistant\n")


def test_continue_final_message_is_refused_where_vllm_refuses_it(tokenizer):
    with pytest.raises(ValueError, match="cannot both be true"):
        render_chat(tokenizer, STARTED, None, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ValueError, match="the assistant's"):
        render_chat(tokenizer, ASKED, None, add_generation_prompt=False, continue_final_message=True)


def test_tools_keep_the_options(tokenizer):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    text = render_chat(tokenizer, STARTED, tools, add_generation_prompt=False, continue_final_message=True)
    assert "<tools>" in text and text.endswith("<|im_start|>assistant\n1, 2,")


def test_template_variables_and_documents_reach_the_template(tokenizer):
    """vLLM's chat_template_kwargs and documents, on a template that reads them (SmolLM2's reads neither)."""
    custom = copy.copy(tokenizer)
    custom.chat_template = (
        "{% for m in messages %}{{ m.content }}{% endfor %}|{{ greeting }}|"
        "{% for d in documents %}{{ d.text }};{% endfor %}"
    )
    documents = [{"title": "a", "text": "first"}, {"title": "b", "text": "second"}]
    text = render_chat(custom, ASKED, None, template_kwargs={"greeting": "hello"}, documents=documents)
    assert text == "Count to five|hello|first;second;"
    assert render_chat(tokenizer, ASKED, None, template_kwargs={"greeting": "x"}) == render_chat(
        tokenizer, ASKED, None
    )


def test_template_variables_may_not_be_apply_chat_templates_own_parameters(tokenizer):
    with pytest.raises(ValueError, match="may not set"):
        render_chat(tokenizer, ASKED, None, template_kwargs={"tokenize": True})
