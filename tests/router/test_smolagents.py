"""A real smolagents `ToolCallingAgent` (its `OpenAIServerModel`, the openai SDK underneath)
through the router and an engine serving the tiny model.

smolagents sends each reply back as it keeps it in memory: text parts, stripped of surrounding
whitespace, and its own messages around it (tool calls as text, errors and observations as user
turns). What was sampled is still what the next prompt continues, so the episode is one segment
captured exactly, without an `assistant_edited` split at every turn."""

from __future__ import annotations

from smolagents import ActionStep, OpenAIServerModel, ToolCallingAgent, tool

from tests.router.test_openai_sdk import assert_exact_capture
from tests.router.test_qwen3_sdk import engine_turn


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def test_tool_calling_agent_episode_is_one_exact_segment(router_app, renderer):
    session = router_app.new_session()
    model = OpenAIServerModel(
        model_id="tiny", api_base=session["base_url"], api_key="unused", client_kwargs={"max_retries": 0}, max_tokens=12
    )
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=10, verbosity_level=0)
    start = len(router_app.engine_log)
    steps = []
    for step in agent.run("What is 1 + 2?", stream=True):
        steps += [step] if isinstance(step, ActionStep) else []
        if len(steps) == 3:  # stop before the agent's final-answer call (another system prompt)
            break
    calls = [engine_turn(e) for e in router_app.engine_log[start:]]
    assert len(calls) == 3
    (sample,) = router_app.store.samples(session["session_id"])  # no split at any turn
    assert_exact_capture(sample, calls, renderer)
