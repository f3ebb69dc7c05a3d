"""The real `google-genai` SDK against the router's Gemini API and a real embedded engine.

The SDK is used with its default configuration apart from the base URL and key: it appends
`/v1beta/models/{model}:generateContent` to the base URL, so a session's base URL without `/v1`.
As with the other SDKs (test_openai_sdk.py), a recording proxy logs what the engine received and
sampled, and the stored sample must equal exactly that. The function-call round trip runs on the
reasoning model (tests/router/reasoning_model.py), which really samples a call to `add` when the
tool config forces it, and `<think>sum</think>add` after its response.
"""

from __future__ import annotations

import httpx
import pytest
from google import genai
from google.genai import errors, types

from slimeish.router.dialects.gemini import CountTokensBody, chat_messages, json_schema
from tests.router import test_reasoning_sdk as R
from tests.router.reasoning_model import CONTENT, REASONING
from tests.router.test_anthropic_sdk import engine_calls
from tests.router.test_openai_sdk import assert_exact_capture, client_for

ADD = types.FunctionDeclaration(
    name="add",
    description="add two numbers",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={"a": types.Schema(type=types.Type.NUMBER), "b": types.Schema(type=types.Type.NUMBER)},
    ),
)


model, router = R.model, R.router  # its engine and router: the fixtures of test_reasoning_sdk.py


def gemini_for(session: dict) -> genai.Client:
    base = session["base_url"].removesuffix("/v1")
    return genai.Client(api_key=session["api_key"], http_options=types.HttpOptions(base_url=base))


def finish(under, session: dict) -> None:
    r = httpx.post(f"{under.url}/sessions/{session['session_id']}/finish", json={"reward": 1}, headers=under.admin)
    assert r.status_code == 200, r.text


def test_generate_then_stream_is_one_exactly_captured_segment(router_app, renderer):
    session = router_app.new_session(group_id="g-gemini")
    client = gemini_for(session)
    start = len(router_app.engine_log)
    config = types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=6, temperature=1.0)
    contents = [types.Content(role="user", parts=[types.Part(text="hi")])]

    r = client.models.generate_content(model="tiny", contents=contents, config=config)
    sampled = router_app.engine_log[-1][1]
    assert r.candidates[0].finish_reason in (types.FinishReason.STOP, types.FinishReason.MAX_TOKENS)
    assert r.usage_metadata.candidates_token_count == len(sampled["output_ids"])
    assert r.usage_metadata.prompt_token_count == len(router_app.engine_log[-1][0]["input_ids"])
    contents += [r.candidates[0].content, types.Content(role="user", parts=[types.Part(text="more")])]

    chunks = list(client.models.generate_content_stream(model="tiny", contents=contents, config=config))
    streamed = "".join(c.text or "" for c in chunks)
    final = router_app.engine_log[-1][1]["chunks"][-1]
    assert chunks[-1].usage_metadata.candidates_token_count == len(final["output_ids"])
    assert streamed.strip() == final["text"].strip()  # the stream is the sampled text (a trailing stop trimmed)

    finish(router_app, session)
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0]
    (sample,) = router_app.store.samples(session["session_id"])
    assert_exact_capture(sample, engine_calls(router_app.engine_log[start:]), renderer)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_a_function_call_and_its_response_are_one_exact_segment(router, model, stream):
    session = router.new_session()
    client = gemini_for(session)
    start = len(router.engine_log)
    tools = [types.Tool(function_declarations=[ADD])]
    forced = types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode="ANY", allowed_function_names=["add"])
    )
    base = {"system_instruction": "You add numbers.", "tools": tools, "max_output_tokens": 16}
    thoughts = types.ThinkingConfig(include_thoughts=True)

    def ask(contents: list, **kw) -> types.GenerateContentResponse:
        config = types.GenerateContentConfig(**base, **kw)
        if not stream:
            return client.models.generate_content(model="tiny", contents=contents, config=config)
        chunks = list(client.models.generate_content_stream(model="tiny", contents=contents, config=config))
        parts = [p for c in chunks if c.candidates and c.candidates[0].content for p in c.candidates[0].content.parts]
        chunks[-1].candidates[0].content.parts = [p for p in parts if p.text or p.function_call]
        return chunks[-1]

    contents = [types.Content(role="user", parts=[types.Part(text="1 + 2?")])]
    r = ask(contents, tool_config=forced)
    (call,) = r.function_calls
    assert (call.name, call.args) == ("add", {})
    response = types.Part.from_function_response(name="add", response={"result": 3})
    contents += [r.candidates[0].content, types.Content(role="user", parts=[response])]

    r = ask(contents, thinking_config=thoughts)
    thought, text = r.candidates[0].content.parts
    assert (thought.thought, thought.text, text.text) == (True, REASONING, CONTENT)
    assert r.text == CONTENT  # the SDK leaves thoughts out of `text`
    contents += [r.candidates[0].content, types.Content(role="user", parts=[types.Part(text="go on")])]
    ask(contents)

    finish(router, session)
    R.one_exact_segment(router, model, session, start, 3)


def test_chat_then_gemini_is_one_segment(router_app, renderer):
    session = router_app.new_session(group_id="g-mixed-gemini")
    start = len(router_app.engine_log)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    first = client_for(session).chat.completions.create(model="tiny", messages=chat, max_tokens=4)
    said = first.choices[0].message.content
    config = types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=4)
    contents = [
        types.Content(role="user", parts=[types.Part(text="hi")]),
        types.Content(role="model", parts=[types.Part(text=said)]),
        types.Content(role="user", parts=[types.Part(text="more")]),
    ]
    gemini = gemini_for(session)  # held: the SDK closes its HTTP client when the Client is collected
    gemini.models.generate_content(model="tiny", contents=contents, config=config)

    finish(router_app, session)
    assert [t.segment_index for t in router_app.store.turns[session["session_id"]]] == [0, 0]
    (sample,) = router_app.store.samples(session["session_id"])
    assert_exact_capture(sample, engine_calls(router_app.engine_log[start:]), renderer)


def test_count_tokens_is_the_rendered_prompt(router_app, renderer):
    session = router_app.new_session()
    client = gemini_for(session)
    counted = client.models.count_tokens(model="tiny", contents="hi")
    assert counted.total_tokens == len(renderer.full_ids([{"role": "user", "content": "hi"}], None))


GOOD = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 2}}
BAD = {
    "two candidates": ({**GOOD, "generationConfig": {"candidateCount": 2}}, "candidateCount"),
    "no contents": ({"contents": []}, "contents"),
    "a bad role": ({"contents": [{"role": "robot", "parts": [{"text": "hi"}]}]}, "contents.0.role"),
    "an image": ({"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]}, "text-only"),
    "an unanswered response": (
        {"contents": [{"parts": [{"functionResponse": {"name": "add", "response": {}}}]}]},
        "answers no functionCall",
    ),
    "a forced unknown function": (
        {
            **GOOD,
            "tools": [{"functionDeclarations": [{"name": "add"}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["mul"]}},
        },
        "mul",
    ),
    "too hot": ({**GOOD, "generationConfig": {"temperature": 3}}, "temperature"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_bad_bodies_are_google_shaped_400s_and_leave_the_session(router_app, case):
    body, says = case
    session = router_app.new_session()
    base = session["base_url"].removesuffix("/v1")
    r = httpx.post(f"{base}/v1beta/models/tiny:generateContent", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT" and says in error["message"]
    assert router_app.record(session["session_id"])["turns"] == 0


def test_the_sdk_raises_googles_errors(router_app):
    session = router_app.new_session()
    config = types.GenerateContentConfig(candidate_count=2)
    client = gemini_for(session)
    with pytest.raises(errors.ClientError) as raised:
        client.models.generate_content(model="tiny", contents="hi", config=config)
    assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
    wrong = genai.Client(api_key="sk-slimeish-nope", http_options=types.HttpOptions(base_url=router_app.url))
    with pytest.raises(errors.ClientError) as raised:
        wrong.models.generate_content(model="tiny", contents="hi")
    assert raised.value.code == 401 and raised.value.status == "UNAUTHENTICATED"


def test_the_key_in_a_header_or_the_query_finds_the_session(router_app):
    session = router_app.new_session()
    url = f"{router_app.url}/v1beta/models/tiny:generateContent"
    r = httpx.post(url, json=GOOD, headers={"x-goog-api-key": session["api_key"]})
    assert r.status_code == 200, r.text
    r = httpx.post(url, params={"key": session["api_key"]}, json=GOOD)
    assert r.status_code == 200, r.text
    assert router_app.record(session["session_id"])["turns"] == 2


def test_googles_schema_types_become_json_schema():
    declared = {
        "type": "OBJECT",
        "properties": {"type": {"type": "STRING"}, "n": {"type": "ARRAY", "items": {"type": "INTEGER"}}},
    }
    assert json_schema(declared) == {
        "type": "object",
        "properties": {"type": {"type": "string"}, "n": {"type": "array", "items": {"type": "integer"}}},
    }


def test_responses_without_ids_answer_their_names_calls_in_order():
    call = lambda a: {"functionCall": {"name": "add", "args": {"a": a}}}  # noqa: E731
    answer = lambda r: {"functionResponse": {"name": "add", "response": {"r": r}}}  # noqa: E731
    contents = [
        {"role": "user", "parts": [{"text": "1 + 1 and 2 + 2?"}]},
        {"role": "model", "parts": [call(1), call(2)]},
        {"role": "user", "parts": [answer(2), answer(4), {"text": "and?"}]},
    ]
    _, model, *rest = chat_messages(CountTokensBody.model_validate({"contents": contents}))
    ids = [c["id"] for c in model["tool_calls"]]
    assert ids == ["call_1_0", "call_1_1"]  # no ids sent: fixed by their place
    assert rest == [
        {"role": "tool", "tool_call_id": ids[0], "content": '{"r": 2}'},
        {"role": "tool", "tool_call_id": ids[1], "content": '{"r": 4}'},
        {"role": "user", "content": "and?"},
    ]


def test_wrong_methods_and_unknown_paths_are_google_shaped(router_app):
    wrong = httpx.get(f"{router_app.url}/v1beta/models/tiny:generateContent")
    assert wrong.status_code == 405 and wrong.json()["error"]["status"] == "INVALID_ARGUMENT"
    for path in ("/v1beta/models/tiny:embedContent", "/v1/models/tiny:batchGenerateContent"):
        unknown = httpx.post(router_app.url + path, json=GOOD)
        assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND", unknown.text
