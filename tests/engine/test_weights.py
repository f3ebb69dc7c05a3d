"""Weight updates on a real engine: from disk, from a safetensors file in /dev/shm, across a pause."""

from __future__ import annotations

import concurrent.futures
import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from tests.engine.sglang_schema import validate_generate_response

PROMPT = [5, 17, 42, 99, 7]
GREEDY = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}


def perturbed_state(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    state = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory, engine_starter):
    proc, url = engine_starter(tiny_model, tmp_path_factory.mktemp("engine-weights-logs"))
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client
    finally:
        proc.stop()


@pytest.fixture
def shm_file():
    path = Path("/dev/shm") / f"slimeish-test-{uuid.uuid4().hex}.safetensors"
    yield path
    path.unlink(missing_ok=True)


def generate(client: httpx.Client, body: dict) -> dict:
    out = client.post("/generate", json=body).json()
    validate_generate_response(out)
    return out


def test_update_from_disk_changes_generation_and_version(engine, tiny_model, tmp_path):
    before = generate(engine, GREEDY)
    new_dir = shutil.copytree(tiny_model, tmp_path / "updated")
    save_file(perturbed_state(tiny_model, seed=1), str(new_dir / "model.safetensors"), metadata={"format": "pt"})
    r = engine.post("/update_weights_from_disk", json={"model_path": str(new_dir), "weight_version": "3"})
    assert r.status_code == 200 and r.json()["success"] and r.json()["weight_version"] == "3"
    after = generate(engine, {**GREEDY, "return_logprob": True})
    assert after["output_ids"] != before["output_ids"] and after["meta_info"]["weight_version"] == "3"
    assert engine.get("/model_info").json()["weight_version"] == "3"
    # The new logprobs are those of the new checkpoint.
    model = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + after["output_ids"]])).logits[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits, -1)[torch.arange(16), torch.tensor(after["output_ids"])]
    got = torch.tensor([e[0] for e in after["meta_info"]["output_token_logprobs"]])
    assert (got - expected).abs().max().item() <= 1e-4


def test_update_from_tensor_across_a_pause(engine, tiny_model, shm_file):
    before = generate(engine, GREEDY)
    version = int(engine.get("/model_info").json()["weight_version"])
    save_file(perturbed_state(tiny_model, seed=2), str(shm_file))
    long_body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = pool.submit(engine.post, "/generate", json=long_body)
        time.sleep(0.3)
        assert engine.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
        waiting = pool.submit(engine.post, "/generate", json=GREEDY)
        time.sleep(0.3)
        assert not running.done() and not waiting.done()
        update = {"serialized_named_tensors": [str(shm_file)], "load_format": "safetensors_path", "flush_cache": True}
        r = engine.post("/update_weights_from_tensor", json=update)
        assert r.status_code == 200 and r.json()["weight_version"] == str(version + 1)
        assert engine.post("/continue_generation").status_code == 200
        long_out, short_out = running.result().json(), waiting.result().json()
    # The request paused mid-decode finished, and says which tokens came from which weights.
    assert long_out["meta_info"]["finish_reason"]["type"] == "length"
    spans = long_out["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == [str(version), str(version + 1)] and spans[-1]["end"] == 2000
    assert long_out["meta_info"]["weight_version"] == str(version + 1)
    assert short_out["output_ids"] != before["output_ids"]
    assert short_out["meta_info"]["weight_version"] == str(version + 1)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/update_weights_from_tensor",
            {"serialized_named_tensors": ["/dev/shm/missing"], "load_format": "safetensors_path"},
        ),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["abc"], "load_format": None}),
        ("/update_weights_from_disk", {"model_path": "/nonexistent"}),
    ],
)
def test_bad_updates_are_400_and_change_nothing(engine, path, body):
    version = engine.get("/model_info").json()["weight_version"]
    assert engine.post(path, json=body).status_code == 400
    assert engine.get("/model_info").json()["weight_version"] == version
    assert engine.get("/health_generate").status_code == 200


def test_wrong_tensor_names_are_rejected(engine, shm_file):
    save_file({"not.a.param": torch.zeros(2)}, str(shm_file))
    body = {"serialized_named_tensors": [str(shm_file)], "load_format": "safetensors_path"}
    r = engine.post("/update_weights_from_tensor", json=body)
    assert r.status_code == 400 and "unknown parameter names" in r.json()["message"]


def test_a_weight_version_that_is_no_integer_is_400_and_changes_nothing(engine, tiny_model):
    version = engine.get("/model_info").json()["weight_version"]
    r = engine.post("/update_weights_from_disk", json={"model_path": str(tiny_model), "weight_version": "latest"})
    assert r.status_code == 400 and "integer" in r.text
    assert engine.get("/model_info").json()["weight_version"] == version


def test_a_weight_update_invalidates_cached_prefixes(engine, tiny_model, tmp_path):
    """KV computed by the old weights is never reused: the request after the update misses the
    cache and scores with the new weights; the one after that hits the new weights' KV."""
    prompt = list(range(200, 250))
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True}
    generate(engine, body)
    assert generate(engine, body)["meta_info"]["cached_tokens"] == 48
    new_dir = shutil.copytree(tiny_model, tmp_path / "updated")
    save_file(perturbed_state(tiny_model, seed=3), str(new_dir / "model.safetensors"), metadata={"format": "pt"})
    assert engine.post("/update_weights_from_disk", json={"model_path": str(new_dir)}).json()["success"]
    after, hit = generate(engine, body), generate(engine, body)
    assert (after["meta_info"]["cached_tokens"], hit["meta_info"]["cached_tokens"]) == (0, 48)
    model = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32)
    ids = after["output_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
    for out in (after, hit):
        assert out["output_ids"] == ids
        got = torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])
        assert (got - expected).abs().max().item() <= 1e-4
