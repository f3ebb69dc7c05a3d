"""A dialect converts only what a turn adds, and gets the same messages as converting it all."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import orjson
import pytest

from slimeish.router.dialects import messages as M
from slimeish.router.dialects import responses as R
from slimeish.router.dialects.incremental import Converted, convert
from slimeish.router.sessions import DialectMemory

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


REASONING = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]}
# the new tail starts with the message and the call that the reasoning item before the cut opened
WITH_REASONING = [[*TURNS[0], REASONING], *([*TURNS[0], REASONING, *t[1:]] for t in TURNS[1:])]
verified = partial(R._converted, lambda reference, text: True)


@pytest.mark.parametrize("turns", [TURNS, WITH_REASONING], ids=["items", "with-reasoning"])
def test_responses_items_converted_incrementally_equal_a_full_conversion(turns):
    session = SimpleNamespace(memory=DialectMemory())
    for raw in turns:
        full, _ = verified(raw, 0, frozenset())
        assert convert(session, "responses", raw, verified, R._resumable) == full  # type: ignore[arg-type]
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    reasoning = {"reasoning_content": "r"} if turns is WITH_REASONING else {}
    assert full[1] == {"role": "assistant", "content": "ok", **reasoning, "tool_calls": [call]}


def test_an_episode_of_messages_and_calls_is_converted_incrementally():
    """What most agents send: each turn adds the reply's items and the next user or tool item.
    The earlier messages are the objects converted before (the whole history is not converted
    again, which made a Responses turn's CPU and garbage grow with the episode)."""
    reply, user = {"type": "message", "role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "3"}
    session, raw, first = SimpleNamespace(memory=DialectMemory()), [{"role": "user", "content": "hi"}], None
    for tail in ([reply, user], [CALL, output], [reply, CALL, output], [reply, user]):
        raw = [*raw, *tail]
        messages = convert(session, "responses", raw, verified, R._resumable)  # type: ignore[arg-type]
        assert messages == verified(raw, 0, frozenset())[0]
        first = first or messages[0]
        assert messages[0] is first


@pytest.mark.parametrize(
    ("items", "extends"),
    [
        ([{"role": "user", "content": "hi there"}, {"role": "user", "content": "x"}], True),
        ([{"role": "user", "content": "hi there!"}, {"role": "user", "content": "x"}], False),  # edited
        ([{"role": "user", "content": "hi"}, {"role": "user", "content": "x"}], False),  # edited, shorter
        ([{"role": "user", "content": "hi there"}], False),  # the same items again
        ([1, 2], False),  # more items, fewer bytes than the ones kept
    ],
)
def test_a_request_extends_the_items_kept_only_when_it_starts_with_them(items, extends):
    kept = [{"role": "user", "content": "hi there"}]
    cache = Converted(len(kept), orjson.dumps(kept), [], frozenset())
    assert cache.extended_by(items, orjson.dumps(items)) is extends


def test_messages_converted_incrementally_equal_a_full_conversion_and_check_only_the_tail():
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]}
    raw = [{"role": "user", "content": "hi"}, use, result]
    session = SimpleNamespace(memory=DialectMemory())
    for n in range(1, len(raw) + 1):
        converter = partial(M._converted, lambda signature, text: True)
        assert convert(session, "messages", raw[:n], converter) == converter(raw[:n], 0, frozenset())[0]  # type: ignore[arg-type]
    assert session.memory.converted["messages"].calls == frozenset()
