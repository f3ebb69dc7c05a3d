"""One session, three dialects: every dialect becomes the same conversation, so an agent that
switches API mid-episode and sends back what it got still extends one segment."""

from __future__ import annotations

import anthropic
import httpx

from tests.router.test_anthropic_sdk import engine_calls
from tests.router.test_openai_sdk import assert_exact_capture, client_for


def test_chat_then_messages_then_responses_is_one_segment(router_app, renderer):
    session = router_app.new_session(group_id="g-mixed")
    openai_client = client_for(session)
    claude = anthropic.Anthropic(base_url=session["base_url"].removesuffix("/v1"), api_key="x", max_retries=0)
    start = len(router_app.engine_log)

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    first = openai_client.chat.completions.create(model="tiny", messages=chat, max_tokens=4).choices[0].message
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.content}]

    second = claude.messages.create(
        model="tiny", system="Be brief.", max_tokens=4, messages=[*said, {"role": "user", "content": "more"}]
    )
    said += [{"role": "user", "content": "more"}, {"role": "assistant", "content": second.content[0].text}]

    openai_client.responses.create(
        model="tiny", instructions="Be brief.", max_output_tokens=4, input=[*said, {"role": "user", "content": "again"}]
    )

    r = httpx.post(
        f"{router_app.url}/sessions/{session['session_id']}/finish", json={"reward": 1}, headers=router_app.admin
    )
    assert r.status_code == 200, r.text
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0, 0]
    (sample,) = router_app.store.samples(session["session_id"])
    assert_exact_capture(sample, engine_calls(router_app.engine_log[start:]), renderer)
