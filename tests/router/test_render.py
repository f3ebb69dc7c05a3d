"""Tail rendering equals the corresponding slice of a full render (the template is prefix-stable)."""

from __future__ import annotations

import pytest

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
HISTORY = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "what is 1 + 2?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
]
TAILS = {
    "one tool result": [{"role": "tool", "tool_call_id": "c1", "content": "3"}],
    "two tool results": [
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": "4"},
    ],
    "user text parts": [
        {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "text", "text": "2+2"}]}
    ],
    "system then user": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ok"}],
}


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
@pytest.mark.parametrize("tail", list(TAILS), ids=list(TAILS))
def test_tail_ids_match_full_render(renderer, tail, tools):
    prefix_text = renderer.render_text(HISTORY, tools, generation_prompt=False)
    full = renderer.full_ids(HISTORY + TAILS[tail], tools)
    # the sampled reply ends with eos; the template's "\n" after it was not sampled
    sampled_end = renderer.encode(prefix_text[: prefix_text.rindex(renderer.eos_token) + len(renderer.eos_token)])
    tail_ids = renderer.tail_ids(HISTORY[-1], True, TAILS[tail])
    assert sampled_end + tail_ids == full


def test_tail_without_sampled_eos_adds_the_closing(renderer):
    """A reply cut by max_tokens has no eos: the template's eos + newline are prompt tokens."""
    tail = renderer.tail_ids({"role": "assistant", "content": "hi"}, False, TAILS["one tool result"])
    assert tail[:2] == renderer.encode(renderer.eos_token + "\n")
    assert tail[0] == renderer.eos_token_id


def test_developer_role_renders_as_system(renderer):
    dev = renderer.render_text([{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}], None)
    sys = renderer.render_text([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}], None)
    assert dev == sys
