"""Sub-agents: a harness that runs a helper agent (its own system prompt and tools) inside the
same session, interleaved with the main conversation, through the `openai` SDK. Each agent's
turns are a line of their own (`lineage` on each sample), one exactly captured segment each,
instead of a new segment at every switch."""

from __future__ import annotations

from slimeish.buffer.segments import LINEAGE
from tests.router.test_openai_sdk import TOOLS, assert_exact_capture, client_for
from tests.router.test_qwen3_sdk import engine_turn

SEARCH = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]


def test_interleaved_agents_are_one_segment_each(router_app, renderer):
    session = router_app.new_session()
    client = client_for(session)
    start = len(router_app.engine_log)
    agents = {
        "main": ([{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "1 + 2?"}], TOOLS),
        "sub": ([{"role": "system", "content": "You search."}, {"role": "user", "content": "find it"}], SEARCH),
    }
    order = ["main", "sub", "main", "sub", "main"]
    for turn, name in enumerate(order):
        messages, tools = agents[name]
        r = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=6, seed=turn)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    calls = [engine_turn(e) for e in router_app.engine_log[start:]]
    main, sub = router_app.store.samples(session["session_id"])
    assert (main.split_reason, sub.split_reason) == (None, "tools_changed")  # the sub-agent's first turn
    assert (main.metadata[LINEAGE], sub.metadata[LINEAGE]) == (0, 1)
    assert_exact_capture(main, [c for c, name in zip(calls, order, strict=True) if name == "main"], renderer)
    assert_exact_capture(sub, [c for c, name in zip(calls, order, strict=True) if name == "sub"], renderer)
    segments = router_app.record(session["session_id"])["segments"]
    assert [s["index"] for s in segments] == [0, 1]
