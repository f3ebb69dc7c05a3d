"""A real `slimeish engine` process: SGLang's contract, exact logprobs, batching, bad input."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.engine.sglang_schema import parse_sse, validate_generate_request, validate_generate_response

PROMPT = [5, 17, 42, 99, 7]


def post_generate(client: httpx.Client, body: dict):
    validate_generate_request(body)  # what we send is a valid SGLang request too
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    validate_generate_response(out)
    return out


@pytest.mark.parametrize("logprob", [False, True])
def test_plain_batch_and_n_match_sglang_schema(client, logprob):
    params = {"max_new_tokens": 6, "temperature": 0.8, "ignore_eos": True}
    one = post_generate(client, {"input_ids": PROMPT, "sampling_params": params, "return_logprob": logprob})
    assert len(one["output_ids"]) == 6 and one["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert int(one["meta_info"]["weight_version"]) == 0
    assert ("output_token_logprobs" in one["meta_info"]) is logprob
    batch = post_generate(
        client, {"text": ["the answer", "add one"], "sampling_params": params, "return_logprob": logprob}
    )
    assert [b["index"] for b in batch] == [0, 1]
    many = post_generate(client, {"input_ids": PROMPT, "sampling_params": {**params, "n": 3}})
    assert len(many) == 3 and len({m["meta_info"]["id"] for m in many}) == 3


@pytest.mark.parametrize("logprob", [False, True])
def test_stream_chunks_match_sglang_schema(client, logprob):
    body = {"input_ids": [PROMPT, PROMPT[:2]], "stream": True, "return_logprob": logprob}
    body["sampling_params"] = {"max_new_tokens": 5, "ignore_eos": True, "sampling_seed": 1}
    validate_generate_request(body)
    with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = parse_sse(r.iter_lines())
    ids: dict[int, list[int]] = {0: [], 1: []}
    for chunk in chunks:
        validate_generate_response(chunk)
        # As in SGLang's default streaming, each chunk holds everything so far: it extends the last.
        assert chunk["output_ids"][: len(ids[chunk["index"]])] == ids[chunk["index"]]
        assert len(chunk["output_ids"]) > len(ids[chunk["index"]])
        ids[chunk["index"]] = chunk["output_ids"]
        if logprob:
            assert len(chunk["meta_info"]["output_token_logprobs"]) == len(chunk["output_ids"])
    assert all(len(v) == 5 for v in ids.values())
    assert sum(c["meta_info"]["finish_reason"] is not None for c in chunks) == 2
    plain = post_generate(client, {**body, "stream": False})
    assert [p["output_ids"] for p in plain] == [ids[0], ids[1]]  # same seed, same tokens


def test_logprobs_equal_a_full_hf_forward(client, tiny_model):
    """The engine's logprobs are log_softmax(raw logits) at the sampled tokens, whatever the sampling."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [8]]
    params = [
        {"max_new_tokens": 40, "ignore_eos": True},
        {"max_new_tokens": 25, "temperature": 0.6, "top_p": 0.8, "top_k": 20, "ignore_eos": True},
        {"max_new_tokens": 30, "temperature": 0},
    ]
    outs = post_generate(client, {"input_ids": prompts, "sampling_params": params, "return_logprob": True})
    for prompt, out in zip(prompts, outs, strict=True):
        ids = out["output_ids"]
        entries = out["meta_info"]["output_token_logprobs"]
        assert [e[1] for e in entries] == ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1)[torch.arange(len(ids)), torch.tensor(ids)]
        got = torch.tensor([e[0] for e in entries])
        assert (got - expected).abs().max().item() <= 1e-4


def test_prompt_logprobs_equal_a_full_hf_forward(client, tiny_model):
    """A teacher's scoring request as slime's OPD reward sends it: no output, every input
    position's log-prob (the first None), in a batch with a prompt scored from position 3."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    body = {
        "input_ids": prompts,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": [0, 3],
    }
    outs = post_generate(client, body)
    for prompt, start, out in zip(prompts, [0, 3], outs, strict=True):
        assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        entries = out["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in entries] == prompt[start:]
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, :-1]
        expected = torch.log_softmax(logits.float(), -1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        got = [e[0] for e in entries]
        if start == 0:
            assert got[0] is None
            got = got[1:]
        assert (torch.tensor(got) - expected[max(start, 1) - 1 :]).abs().max().item() <= 1e-5


def test_prompt_logprob_of_a_sampled_token_is_what_generation_reported(client):
    gen = post_generate(
        client,
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}, "return_logprob": True},
    )
    scored = post_generate(
        client,
        {
            "input_ids": PROMPT + gen["output_ids"],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": len(PROMPT),
        },
    )
    reported = [e[0] for e in gen["meta_info"]["output_token_logprobs"]]
    entries = scored["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == gen["output_ids"]
    assert torch.allclose(torch.tensor([e[0] for e in entries]), torch.tensor(reported), atol=1e-5)
    # SGLang's default (-1): output log-probs only
    assert gen["meta_info"]["input_token_logprobs"] == []


def test_sampling_seed_reproduces_and_stops_apply(client):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "sampling_seed": 7, "ignore_eos": True}}
    a, b = post_generate(client, body), post_generate(client, body)
    assert a["output_ids"] == b["output_ids"]
    stop_id = a["output_ids"][3]
    body["sampling_params"] |= {"stop_token_ids": [stop_id]}
    c = post_generate(client, body)
    assert c["output_ids"][-1] == stop_id and len(c["output_ids"]) <= 4
    assert c["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    # A stop string taken from the middle of the seeded output ends the same sampling there.
    assert len(a["text"]) >= 8
    stop_text = a["text"][len(a["text"]) // 2 : len(a["text"]) // 2 + 3]
    body["sampling_params"] = {"max_new_tokens": 12, "sampling_seed": 7, "ignore_eos": True, "stop": [stop_text]}
    d = post_generate(client, body)
    assert d["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_text}
    assert stop_text not in d["text"] and a["text"].startswith(d["text"])
    assert a["output_ids"][: len(d["output_ids"])] == d["output_ids"]


def test_short_request_finishes_while_long_one_decodes(client):
    long_body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2500, "ignore_eos": True}}
    short_body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        long_future = pool.submit(client.post, "/generate", json=long_body)
        time.sleep(0.5)  # the long one is decoding
        assert not long_future.done()
        short = client.post("/generate", json=short_body)
        assert short.status_code == 200 and not long_future.done()
        assert len(long_future.result().json()["output_ids"]) == 2500


def test_abort_request_finishes_with_abort(client):
    body = {"rid": "to-abort", "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.post, "/generate", json=body)
        time.sleep(0.5)
        assert client.post("/abort_request", json={"rid": "to-abort"}).json()["num_aborted"] == 1
        out = future.result().json()
    validate_generate_response(out)
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < 3000


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": PROMPT, "sampling_params": {"max_new_token": 5}}, "accepted keys"),
        ({"input_ids": PROMPT, "sampling_params": {"temperature": "hot"}}, "temperature"),
        ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5000}}, "maximum context length of 4096"),
        ({"input_ids": [1, 10**6]}, "outside the vocabulary"),
        ({"input_ids": "abc"}, "input_ids"),
        ({"text": "hi", "stream": "yes"}, "stream"),
        ({"input_ids": PROMPT, "sampling_params": {"n": 3000}}, "at most 256 per request"),
        ({"input_ids": [PROMPT] * 200, "sampling_params": {"n": 2}}, "asks for 400 sequences"),
        ({"input_ids": PROMPT, "return_routed_experts": True}, "needs a Mixture-of-Experts model"),
        ({"input_ids": PROMPT, "return_routed_experts": "yes"}, "return_routed_experts must be a bool"),
    ],
)
def test_bad_input_is_a_400_and_the_server_stays_healthy(client, body, needle):
    r = client.post("/generate", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]
    assert client.get("/health_generate").status_code == 200


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"text": "\xff\xfe"}',  # not UTF-8
        b"[" * 100_000,  # nesting that would exhaust a recursive parser's stack
        b'{"text": "\\ud800 alone"}',  # a lone surrogate: no tokenizer can encode it
    ],
)
def test_undecodable_bodies_are_a_json_400(client, content):
    r = client.post("/generate", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert client.get("/health_generate").status_code == 200


def test_info_endpoints(client, tiny_model):
    info = client.get("/model_info").json()
    assert info["model_path"] == str(tiny_model) and info["is_generation"] and info["weight_version"] == "0"
    assert info["engine"] == "slimeish"  # `slimeish train --engine-url` allows tensor weight sync only then
    server = client.get("/server_info").json()
    assert server["max_context_length"] == 4096 and server["internal_states"][0]["paused"] is False
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == str(tiny_model)
    assert client.post("/flush_cache").status_code == 200


def test_a_client_that_hangs_up_frees_its_slot(client, engine_url):
    """While paused nothing can finish on its own, so an empty queue after the hang-up is the abort."""

    def states():
        state = client.get("/server_info").json()["internal_states"][0]
        return {k: state[k] for k in ("paused", "num_running", "num_waiting")}

    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    client.post("/pause_generation", json={})
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{engine_url}/generate", json=body, timeout=0.5)
        deadline = time.monotonic() + 10
        while states()["num_waiting"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert states() == {"paused": True, "num_running": 0, "num_waiting": 0}
    finally:
        client.post("/continue_generation")


def test_flush_cache_empties_the_prefix_cache(client):
    body = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    first, again = post_generate(client, body), post_generate(client, body)
    # pages of 16 tokens; the last prompt token is always computed: 39 cacheable, 32 cached
    assert (first["meta_info"]["cached_tokens"], again["meta_info"]["cached_tokens"]) == (0, 32)
    assert again["output_ids"] == first["output_ids"]
    r = client.post("/flush_cache")
    assert r.status_code == 200 and r.text == "Cache flushed."
    assert client.get("/server_info").json()["internal_states"][0]["cached_tokens"] == 0
    assert post_generate(client, body)["meta_info"]["cached_tokens"] == 0
