"""Per-session sampling defaults: what reaches the engine when a turn omits a field, and bad defaults."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from slimeish.common.sample import Sample
from slimeish.rollout import RolloutConfig
from slimeish.rollout_functions.sessions import Session, http_client, run_groups
from tests.router.conftest import ADMIN_TOKEN, recording_proxy
from tests.stand_in import serve_app

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DEFAULTS = {"temperature": 0.0, "top_p": 0.5, "top_k": 3}


def engine_sampling(router_app) -> dict:
    """The sampling params the engine received for the latest turn."""
    request, _ = router_app.engine_log[-1]
    return {k: v for k, v in request["sampling_params"].items() if k in ("temperature", "top_p", "top_k")}


def test_omitted_fields_take_the_session_defaults(router_app):
    s = router_app.new_session(sampling_defaults=DEFAULTS)
    assert router_app.record(s["session_id"])["sampling_defaults"] == DEFAULTS
    httpx.post(s["base_url"] + "/chat/completions", json=CHAT).raise_for_status()
    assert engine_sampling(router_app) == DEFAULTS
    completion = {"model": "tiny", "prompt": "one two", "max_tokens": 2}
    httpx.post(s["base_url"] + "/completions", json=completion).raise_for_status()
    assert engine_sampling(router_app) == DEFAULTS
    generate_url = s["base_url"].removesuffix("/v1") + "/generate"
    httpx.post(generate_url, json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}).raise_for_status()
    assert engine_sampling(router_app) == DEFAULTS


def test_an_explicit_value_wins_over_the_default(router_app):
    s = router_app.new_session(sampling_defaults=DEFAULTS)
    httpx.post(s["base_url"] + "/chat/completions", json={**CHAT, "temperature": 1.0, "top_k": 5}).raise_for_status()
    assert engine_sampling(router_app) == {"temperature": 1.0, "top_p": 0.5, "top_k": 5}
    completion = {"model": "tiny", "prompt": "one two", "max_tokens": 2, "top_p": 0.9}
    httpx.post(s["base_url"] + "/completions", json=completion).raise_for_status()
    assert engine_sampling(router_app) == {"temperature": 0.0, "top_p": 0.9, "top_k": 3}
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0.7}}
    httpx.post(s["base_url"].removesuffix("/v1") + "/generate", json=body).raise_for_status()
    assert engine_sampling(router_app) == {"temperature": 0.7, "top_p": 0.5, "top_k": 3}


def test_a_default_budget_and_stop_strings_reach_turns_without_them(router_app):
    s = router_app.new_session(sampling_defaults={"max_new_tokens": 3, "stop": ["\n\n"]})
    no_budget = {k: v for k, v in CHAT.items() if k != "max_tokens"}
    httpx.post(s["base_url"] + "/chat/completions", json=no_budget).raise_for_status()
    sent = router_app.engine_log[-1][0]["sampling_params"]
    assert (sent["max_new_tokens"], sent["stop"]) == (3, ["\n\n"])
    httpx.post(s["base_url"] + "/chat/completions", json={**CHAT, "stop": "END"}).raise_for_status()
    sent = router_app.engine_log[-1][0]["sampling_params"]
    assert (sent["max_new_tokens"], sent["stop"]) == (2, ["END"])  # the request's own values win
    body = {"input_ids": [1, 2, 3], "sampling_params": {}}
    httpx.post(s["base_url"].removesuffix("/v1") + "/generate", json=body).raise_for_status()
    sent = router_app.engine_log[-1][0]["sampling_params"]
    assert (sent["max_new_tokens"], sent["stop"]) == (3, ["\n\n"])


def test_a_default_budget_is_capped_by_the_context_not_refused(router_factory, engine_url):
    log: list = []
    with serve_app(recording_proxy(engine_url, log), startup_timeout=30) as proxy:
        router = router_factory([proxy], context_length=48)
        s = router.new_session(sampling_defaults={"max_new_tokens": 10**6})
        no_budget = {k: v for k, v in CHAT.items() if k != "max_tokens"}
        httpx.post(s["base_url"] + "/chat/completions", json=no_budget).raise_for_status()
        sent = log[-1][0]
        assert sent["sampling_params"]["max_new_tokens"] + len(sent["input_ids"]) == 48
        r = httpx.post(s["base_url"] + "/chat/completions", json={**CHAT, "max_tokens": 10**6})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_without_defaults_the_engine_decides(router_app):
    s = router_app.new_session()
    httpx.post(s["base_url"] + "/chat/completions", json=CHAT).raise_for_status()
    assert engine_sampling(router_app) == {}


def test_defaults_apply_to_their_own_session_only(router_app):
    router_app.new_session(sampling_defaults=DEFAULTS)
    other = router_app.new_session(sampling_defaults={"temperature": 0.5})
    httpx.post(other["base_url"] + "/chat/completions", json=CHAT).raise_for_status()
    assert engine_sampling(router_app) == {"temperature": 0.5}


BAD_DEFAULTS = {
    "negative temperature": ({"temperature": -0.1}, "sampling_defaults.temperature"),
    "temperature as text": ({"temperature": "0.5"}, "sampling_defaults.temperature"),
    "temperature as bool": ({"temperature": True}, "sampling_defaults.temperature"),
    "top_p zero": ({"top_p": 0}, "sampling_defaults.top_p"),
    "top_p above one": ({"top_p": 1.5}, "sampling_defaults.top_p"),
    "top_k zero": ({"top_k": 0}, "sampling_defaults.top_k"),
    "top_k float": ({"top_k": 2.5}, "sampling_defaults.top_k"),
    "unknown field": ({"max_tokens": 8}, "sampling_defaults.max_tokens"),
    "zero budget": ({"max_new_tokens": 0}, "sampling_defaults.max_new_tokens"),
    "stop as text": ({"stop": "END"}, "sampling_defaults.stop"),
    "not an object": ("greedy", "sampling_defaults"),
}


@pytest.mark.parametrize("defaults, param", list(BAD_DEFAULTS.values()), ids=list(BAD_DEFAULTS))
def test_bad_defaults_are_a_400_and_open_no_session(router_app, defaults, param):
    opened = len(router_app.store.sessions)
    r = httpx.post(router_app.url + "/sessions", json={"sampling_defaults": defaults}, headers=router_app.admin)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert len(router_app.store.sessions) == opened


def test_a_chat_top_k_is_checked_like_the_default(router_app):
    s = router_app.new_session()
    r = httpx.post(s["base_url"] + "/chat/completions", json={**CHAT, "top_k": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"


@pytest.mark.parametrize("evaluation, temperature", [(False, 0.8), (True, 0.0)])
def test_a_rollout_sets_its_sessions_sampling(router_app, evaluation, temperature):
    """`run_groups` opens each session with the rollout's sampling: an agent that sends none samples
    at the eval temperature when evaluating, the rollout temperature otherwise."""
    cfg = RolloutConfig(
        rollout_temperature=0.8, eval_temperature=0.0, rollout_top_p=0.9, rollout_top_k=20,
        rollout_max_response_len=5, rollout_stop=["Observation:"], n_samples_per_prompt=1,
    )  # fmt: skip
    args = SimpleNamespace(**dataclasses.asdict(cfg), router_url=router_app.url, admin_token=ADMIN_TOKEN)

    async def episode(session: Session, sample: Sample) -> Sample:
        r = await http_client().post(session.base_url + "/chat/completions", json={**CHAT, "max_tokens": None})
        r.raise_for_status()
        sample.reward, sample.status = 1.0, Sample.Status.COMPLETED
        return sample

    groups = [[Sample(group_index=0, index=0, prompt="hi")]]
    ((sample,),) = asyncio.run(run_groups(args, groups, episode, rollout_id=0, evaluation=evaluation))
    assert sample.status != Sample.Status.FAILED, sample.metadata
    assert engine_sampling(router_app) == {"temperature": temperature, "top_p": 0.9, "top_k": 20}
    sent = router_app.engine_log[-1][0]["sampling_params"]
    assert (sent["max_new_tokens"], sent["stop"]) == (5, ["Observation:"])


def scripted_stream_engine(texts: list[str]) -> FastAPI:
    """An engine that streams the cumulative `texts` (one token each) and stops: the only way to
    make a stop string appear in the middle of a stream, as SGLang may send it before trimming."""
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {}

    @app.get("/model_info")
    def model_info() -> dict:
        return {"weight_version": "0"}

    @app.post("/generate")
    def generate() -> StreamingResponse:
        def events():
            for k, text in enumerate(texts, 1):
                meta = {"output_token_logprobs": [[-0.5, 7, None]] * k, "weight_version": "0", "id": "r"}
                if k == len(texts):
                    meta["finish_reason"] = {"type": "stop", "matched": "Observation:"}
                yield b"data: " + orjson.dumps({"text": text, "output_ids": [7] * k, "meta_info": meta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_a_default_stop_string_is_held_back_from_a_stream(router_factory):
    with serve_app(scripted_stream_engine(["Action: x\n", "Action: x\nObserv", "Action: x\n"])) as engine:
        router = router_factory([engine])
        s = router.new_session(sampling_defaults={"stop": ["Observation:"]})
        with httpx.stream("POST", s["base_url"] + "/chat/completions", json={**CHAT, "stream": True}) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = "".join(orjson.loads(x)["choices"][0]["delta"].get("content") or "" for x in lines if x)
    assert streamed == "Action: x\n"
