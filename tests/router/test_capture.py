"""Golden tests of capture: which turns extend a segment, and the reason recorded when not.

The engine is not involved: `sample` stands in for a generation by encoding a reply and
ending it with eos, as a model that stopped normally would.
"""

from __future__ import annotations

import json

import pytest

from slimeish.router import history as H
from slimeish.router.capture import Capture
from slimeish.router.renderers.template import ChatRenderer
from slimeish.router.schemas import validate_messages

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "You add numbers."}
USER = {"role": "user", "content": "1 + 2?"}


def sample(capture: Capture, messages, tools=None, reply_text="The answer is 3.", plan=None):
    """Plan a chat turn, 'generate' `reply_text` + eos, commit; return (plan, committed, reply)."""
    plan = plan or capture.plan_chat(messages, tools, validate_messages)
    output = [*capture.renderer.encode(reply_text), capture.renderer.eos_token_id]
    reply = {"role": "assistant", "content": reply_text}
    return plan, capture.commit(plan, output, reply=reply), reply


def episode(renderer, tools=None):
    """A capture after two turns of one conversation, and its last history + reply."""
    cap = Capture(renderer)
    msgs = [SYSTEM, USER]
    _, c0, r0 = sample(cap, msgs, tools)
    msgs = [*msgs, r0, {"role": "user", "content": "and 2 + 2?"}]
    _, c1, r1 = sample(cap, msgs, tools, "4.")
    assert (c0.segment_index, c0.split_reason, c1.segment_index, c1.split_reason) == (0, None, 0, None)
    return cap, [*msgs, r1]


def next_turn(cap, messages, tools=None):
    plan = cap.plan_chat(messages, tools, validate_messages)
    return plan.segment_index, plan.split_reason


def test_extension_reuses_sampled_tokens_and_renders_only_the_tail(renderer):
    cap = Capture(renderer)
    _, _c0, r0 = sample(cap, [SYSTEM, USER], TOOLS, "<tool_call>\n{}\n</tool_call>")
    seg_tokens = list(cap.segments[0].tokens)
    tail = [{"role": "tool", "tool_call_id": "x", "content": "3"}]
    plan = cap.plan_chat([SYSTEM, USER, r0, *tail], TOOLS, validate_messages)
    assert plan.segment_index == 0 and plan.split_reason is None
    assert plan.input_ids[: len(seg_tokens)] == seg_tokens
    assert plan.prompt_ids == renderer.encode(
        "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_edits_that_do_not_change_what_was_sampled_extend_from_the_sampled_tokens(renderer):
    """smolagents strips each reply's trailing newline; others rewrite call ids and re-serialize arguments."""
    cap = Capture(renderer)
    call = {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    plan = cap.plan_chat([SYSTEM, USER], TOOLS, validate_messages)
    output = [*renderer.encode("Adding.\n"), renderer.eos_token_id]
    cap.commit(plan, output, reply={"role": "assistant", "content": "Adding.\n", "tool_calls": [call]})
    tokens = list(cap.segments[0].tokens)
    rewritten = {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}
    echoed = {"role": "assistant", "content": "Adding.", "tool_calls": [rewritten]}
    tail = [echoed, {"role": "tool", "tool_call_id": "t1", "content": "3"}]
    plan = cap.plan_chat([SYSTEM, USER, *tail], TOOLS, validate_messages)
    assert (plan.segment_index, plan.split_reason) == (0, None)
    assert plan.input_ids[: len(tokens)] == tokens
    edited = {**echoed, "content": "Adding!"}
    assert next_turn(cap, [SYSTEM, USER, edited, tail[1]], TOOLS) == (1, H.ASSISTANT_EDITED)


def test_agent_formatting_differences_still_extend(renderer):
    cap, hist = episode(renderer)
    echoed = {**hist[-1], "content": [{"type": "text", "text": hist[-1]["content"]}], "refusal": None}
    assert next_turn(cap, [*hist[:-1], echoed, {"role": "user", "content": "thanks"}]) == (0, None)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda h: [{**SYSTEM, "content": "You are a sub-agent."}, USER], H.NEW_CONVERSATION),
        (lambda h: [SYSTEM, {"role": "user", "content": "other task"}], H.NEW_CONVERSATION),
        (lambda h: h[:-1], H.PROMPT_REPEATED),
        (lambda h: h[:2], H.HISTORY_TRUNCATED),
        (lambda h: [h[0], *h[3:], {"role": "user", "content": "go on"}], H.HISTORY_TRUNCATED),
        (
            lambda h: [h[0], {"role": "user", "content": "summary"}, *h[4:], {"role": "user", "content": "x"}],
            H.HISTORY_EDITED,
        ),
        (
            lambda h: [*h[:-1], {"role": "assistant", "content": "edited"}, {"role": "user", "content": "x"}],
            H.ASSISTANT_EDITED,
        ),
        (lambda h: [*h[:-1], {"role": "user", "content": "format error"}], H.REPLY_DROPPED),
    ],
    ids=[
        "sub-agent",
        "new-task",
        "retry",
        "truncated-tail",
        "dropped-middle",
        "summarized",
        "assistant-edited",
        "reply-dropped",
    ],
)
def test_split_reasons(renderer, edit, reason):
    cap, hist = episode(renderer)
    assert next_turn(cap, edit(hist)) == (1, reason)


def test_a_conversation_after_a_system_only_turn_is_new_not_a_dropped_reply(renderer):
    cap = Capture(renderer)
    sample(cap, [SYSTEM], None)
    assert next_turn(cap, [SYSTEM, USER]) == (1, H.NEW_CONVERSATION)


SUMMARY = "The user asked for two sums: 1 + 2 and 2 + 2."


def compacted(renderer):
    """An episode whose last turn answered a request for a summary with `SUMMARY`."""
    cap, hist = episode(renderer)
    msgs = [*hist, {"role": "user", "content": "Summarize the conversation."}]
    sample(cap, msgs, None, f"<analysis>Two questions.</analysis>\n<summary>\n{SUMMARY}\n</summary>")
    return cap


def test_compaction_opens_with_the_last_reply_quoted(renderer):
    # Claude Code's auto-compact: the summary, its analysis left out, opens the new conversation
    cap = compacted(renderer)
    opening = {"role": "user", "content": f"This session is being continued.\nSummary:\n{SUMMARY}"}
    assert next_turn(cap, [SYSTEM, opening, {"role": "user", "content": "go on"}]) == (1, H.COMPACTION)
    assert next_turn(cap, [{"role": "system", "content": "Another agent."}, opening]) == (1, H.COMPACTION)


def test_a_new_task_repeating_what_the_conversation_held_is_no_compaction(renderer):
    cap = Capture(renderer)
    task = {"role": "user", "content": "Create a file named hello.txt holding hi."}
    sample(cap, [SYSTEM, task], None, "Create a file named hello.txt holding hi.")  # the reply echoes its task
    again = {"role": "user", "content": "Now: Create a file named hello.txt holding hi."}
    assert next_turn(cap, [SYSTEM, again]) == (1, H.NEW_CONVERSATION)


def agent_call(prompt: str) -> dict:
    arguments = json.dumps({"description": "Count", "prompt": prompt})
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [AGENT_CALL | {"function": {"name": "Agent", "arguments": arguments}}],
    }


AGENT_CALL = {"id": "call_1", "type": "function"}
SUB_TASK = "Count the lines of notes.txt and report the number."
SUB_SYSTEM = {"role": "system", "content": "You are a sub-agent."}


def waiting_on_an_agent(renderer, prompt=SUB_TASK):
    """A capture whose conversation's last reply called a sub-agent tool with `prompt`, and its history."""
    cap = Capture(renderer)
    plan = cap.plan_chat([SYSTEM, USER], TOOLS, validate_messages)
    reply = agent_call(prompt)
    cap.commit(plan, [*renderer.encode("call"), renderer.eos_token_id], reply=reply)
    return cap, [SYSTEM, USER, reply]


def test_a_sub_agent_opens_with_a_tool_call_argument(renderer):
    cap, _ = waiting_on_an_agent(renderer)
    task = {"role": "user", "content": f"<reminder>context</reminder>\n{SUB_TASK}"}
    assert next_turn(cap, [SUB_SYSTEM, task], None) == (1, H.SUB_AGENT)  # its own tools
    assert next_turn(cap, [SUB_SYSTEM, task], TOOLS) == (1, H.SUB_AGENT)  # the parent's tools


def test_a_sub_agent_started_after_its_parent_went_on(renderer):
    # run in the background, the parent's next turn comes first: the call is in its history
    cap, hist = waiting_on_an_agent(renderer)
    result = {"role": "tool", "tool_call_id": "call_1", "content": "launched"}
    _, committed, _ = sample(cap, [*hist, result], TOOLS, "Waiting.")
    assert committed.split_reason is None
    assert next_turn(cap, [SUB_SYSTEM, {"role": "user", "content": SUB_TASK}]) == (1, H.SUB_AGENT)


def test_a_short_argument_says_nothing(renderer):
    cap, _ = waiting_on_an_agent(renderer, "Count it.")
    assert next_turn(cap, [SUB_SYSTEM, {"role": "user", "content": "Count it."}]) == (1, H.TOOLS_CHANGED)


def test_tools_changed(renderer):
    cap, hist = episode(renderer)
    assert next_turn(cap, [*hist, {"role": "user", "content": "x"}], TOOLS) == (1, H.TOOLS_CHANGED)


def test_reasoning_dropped(renderer):
    cap = Capture(renderer)
    _, _, _reply = sample(cap, [SYSTEM, USER], None, "<think>1+2 is 3</think>The answer is 3.")
    stripped = {"role": "assistant", "content": "The answer is 3."}
    assert next_turn(cap, [SYSTEM, USER, stripped, {"role": "user", "content": "x"}]) == (1, H.REASONING_DROPPED)


def test_new_segment_renders_the_whole_conversation(renderer):
    cap, _hist = episode(renderer)
    msgs = [SYSTEM, {"role": "user", "content": "other"}]
    plan = cap.plan_chat(msgs, None, validate_messages)
    assert plan.prompt_ids == plan.input_ids == renderer.full_ids(msgs, None)


def test_parallel_choices_and_resuming_an_earlier_segment(renderer):
    cap = Capture(renderer)
    plan, _c0, r0 = sample(cap, [SYSTEM, USER])
    _, c1, _ = sample(cap, None, plan=cap.fork(plan, H.PARALLEL_CHOICE), reply_text="Three.")
    assert (c1.segment_index, c1.split_reason, c1.prompt_ids) == (1, H.PARALLEL_CHOICE, plan.input_ids)
    # the agent continues with choice 0: its tokens are exact, but only the latest segment grows
    plan2 = cap.plan_chat([SYSTEM, USER, r0, {"role": "user", "content": "x"}], None, validate_messages)
    assert (plan2.segment_index, plan2.split_reason) == (2, H.RESUMED_SEGMENT)
    assert (
        plan2.prompt_ids == plan2.input_ids and plan2.input_ids[: len(cap.segments[0].tokens)] == cap.segments[0].tokens
    )


def test_concurrent_turns_on_one_segment_fork(renderer):
    cap, hist = episode(renderer)
    msgs_a = [*hist, {"role": "user", "content": "a"}]
    msgs_b = [*hist, {"role": "user", "content": "b"}]
    plan_a = cap.plan_chat(msgs_a, None, validate_messages)
    plan_b = cap.plan_chat(msgs_b, None, validate_messages)
    sample(cap, None, plan=plan_a)
    _, cb, _ = sample(cap, None, plan=plan_b)
    assert (cb.segment_index, cb.split_reason, cb.prompt_ids) == (1, H.CONCURRENT_TURN, plan_b.input_ids)


def test_tokens_path(renderer):
    cap = Capture(renderer)
    plan = cap.plan_tokens([5, 6, 7])
    cap.commit(plan, [8, renderer.eos_token_id])
    ext = cap.plan_tokens([5, 6, 7, 8, renderer.eos_token_id, 9])
    assert (ext.segment_index, ext.split_reason, ext.prompt_ids) == (0, None, [9])
    div = cap.plan_tokens([5, 6, 1])
    assert (div.segment_index, div.split_reason, div.prompt_ids) == (1, H.TOKENS_DIVERGED, [5, 6, 1])


def test_text_completions_extend_by_text(renderer):
    cap = Capture(renderer)
    plan = cap.plan_text("1 + 2 =")
    cap.commit(plan, [*renderer.encode(" 3"), renderer.eos_token_id], text=" 3")
    ext = cap.plan_text("1 + 2 = 3. 2 + 2 =")
    assert (ext.segment_index, ext.prompt_ids) == (0, renderer.encode(". 2 + 2 ="))


def test_template_unstable(tiny_model):
    unstable = ChatRenderer(tiny_model)
    # a template that numbers the messages renders each one differently depending on the history
    unstable.tokenizer.chat_template = (
        "{% for m in messages %}{{ loop.length }}:{{ m.role }}:{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    cap = Capture(unstable)
    _, _, r0 = sample(cap, [USER])
    msgs = [USER, r0, {"role": "user", "content": "x"}]
    plan = cap.plan_chat(msgs, None, validate_messages)
    assert (plan.segment_index, plan.split_reason) == (1, H.TEMPLATE_UNSTABLE)
    assert plan.input_ids == unstable.full_ids(msgs, None)


def test_invalid_new_message_is_rejected_before_planning(renderer):
    from slimeish.router.errors import APIError

    cap, hist = episode(renderer)
    with pytest.raises(APIError, match=r"messages\.5"):
        cap.plan_chat([*hist, {"role": "tool", "content": "no id"}], None, validate_messages)
    assert len(cap.segments) == 1


def test_a_turn_planned_before_another_split_starts_its_own_segment(renderer):
    """Turn A extends segment 0; meanwhile turn B (a sub-agent) commits segment 1. Only the latest
    segment may grow, so A lands in a new segment with its full prompt."""
    cap, hist = episode(renderer)
    plan_a = cap.plan_chat([*hist, {"role": "user", "content": "a"}], None, validate_messages)
    plan_b = cap.plan_chat([SYSTEM, {"role": "user", "content": "sub-task"}], None, validate_messages)
    sample(cap, None, plan=plan_b)
    _, ca, _ = sample(cap, None, plan=plan_a)
    assert (ca.segment_index, ca.split_reason, ca.prompt_ids) == (2, H.CONCURRENT_TURN, plan_a.input_ids)
