"""A dialect converts only what a turn adds, and gets the same messages as converting it all."""

from __future__ import annotations

from types import SimpleNamespace

from slimeish.router.dialects import messages as M
from slimeish.router.dialects import responses as R
from slimeish.router.dialects.incremental import convert

CALL = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}
TURNS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "hi"}, {"type": "message", "role": "assistant", "content": "ok"}],
    # the new tail starts with a call that belongs to the assistant message before the cut
    [{"role": "user", "content": "hi"}, {"type": "message", "role": "assistant", "content": "ok"}, CALL],
    [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": "ok"},
        CALL,
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
    ],
]


def test_responses_items_converted_incrementally_equal_a_full_conversion():
    session = SimpleNamespace(converted={})
    for raw in TURNS:
        full, _ = R._converted(raw, 0, frozenset())
        assert convert(session, "responses", raw, R._converted, R._resumable) == full  # type: ignore[arg-type]
    assert full[1] == {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }


def test_messages_converted_incrementally_equal_a_full_conversion_and_check_only_the_tail():
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]}
    raw = [{"role": "user", "content": "hi"}, use, result]
    session = SimpleNamespace(converted={})
    for n in range(1, len(raw) + 1):
        assert convert(session, "messages", raw[:n], M._converted) == M._converted(raw[:n], 0, frozenset())[0]  # type: ignore[arg-type]
    assert session.converted["messages"].calls == frozenset()
