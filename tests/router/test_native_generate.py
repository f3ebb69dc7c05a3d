"""The router's root `POST /generate`: SGLang's native body, as a slime plugin calling
`http://{sglang_router_ip}:{sglang_router_port}/generate` sends it; forwarded, never captured."""

import httpx
import pytest

PARAMS = {"max_new_tokens": 4, "temperature": 0.0}


@pytest.mark.parametrize("prompt", [{"text": "hello there"}, {"input_ids": [5, 6, 7]}])
def test_root_generate_answers_like_an_engine(router_app, prompt):
    turns_before = sum(map(len, router_app.store.turns.values()))
    r = httpx.post(router_app.url + "/generate", json={**prompt, "sampling_params": PARAMS, "return_logprob": True})
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"] and len(out["output_ids"]) <= 4
    assert meta["finish_reason"]["type"] in ("stop", "length") and isinstance(out["text"], str)
    assert router_app.engine_log[-1][0] == {**prompt, "sampling_params": PARAMS, "return_logprob": True}
    assert sum(map(len, router_app.store.turns.values())) == turns_before  # no session: nothing captured


@pytest.mark.parametrize(
    "body, message",
    [
        ({"sampling_params": PARAMS}, "exactly one of `text`"),
        ({"text": "a", "input_ids": [1], "sampling_params": PARAMS}, "exactly one of `text`"),
        ({"text": "a", "stream": True}, "stream is not supported"),
        ({"text": "a", "sampling_params": [1]}, "sampling_params must be a JSON object"),
    ],
)
def test_root_generate_refuses_bad_bodies_with_a_4xx(router_app, body, message):
    r = httpx.post(router_app.url + "/generate", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_root_generate_scores_a_prompt_for_a_teacher(router_app):
    """slime's OPD reward posts prompt + response with `max_new_tokens: 0` and
    `logprob_start_len: 0` to `--rm-url`: the router, as a teacher, answers every input position's
    log-prob in SGLang's shape."""
    ids = [5, 6, 7, 8, 9]
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    r = httpx.post(router_app.url + "/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    entries = out["meta_info"]["input_token_logprobs"]
    assert out["output_ids"] == [] and [t for _, t, _ in entries] == ids
    assert entries[0][0] is None and all(lp < 0 for lp, _, _ in entries[1:])
    assert router_app.engine_log[-1][0] == body
