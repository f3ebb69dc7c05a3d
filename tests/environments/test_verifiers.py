"""verifiers environments (single-turn, multi-turn, tool-using) through `slimeish train`, unmodified:
their own loop, tools and rubric, their client on the member's router session."""

from __future__ import annotations

import json
import sys

import pytest
from transformers import AutoTokenizer

from slimeish.cli import main
from slimeish.rollout_functions.verifiers_env import Verifiers, VerifiersConfig
from tests.environments.conftest import check_run, run_train

ADAPTER = "slimeish.rollout_functions.verifiers_env.generate_rollout"
ENVS = "tests.environments.vf_envs."


def write_prompts(env_id: str, out) -> None:
    adapter = Verifiers(env_id, {})
    out.mkdir()
    for split, n in (("train", 8), ("eval", 2)):
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in adapter.records(n, 0, split)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "env, form",
    [("reverse_text", "path"), ("guess_number", "path"), ("calculator", "path"), ("calculator", "header")],
)
def test_environment_trains_three_steps_with_exact_capture(env, form, tiny_model, stack, tmp_path):
    write_prompts(ENVS + env, tmp_path / "data")
    run_dir = tmp_path / f"vf-{env}-{form}"
    run_train(
        stack, tiny_model, run_dir, ADAPTER, "--env-id", ENVS + env, "--env-session-form", form,
        "--prompt-data", str(tmp_path / "data" / "train.jsonl"), "--rollout-max-response-len", "8",
    )  # fmt: skip
    rubric = {"reverse_text": "prefix_score", "guess_number": "found", "calculator": "correct"}[env]
    samples = check_run(stack, run_dir, scores={rubric, "num_turns"})  # the rubric's parts beside its reward
    if env == "guess_number":  # three guesses with the environment's hints between them, in one segment
        assert all(s.loss_mask.count(0) > 0 for s in samples)
    if env == "calculator":  # the environment's tool reached the model's prompt
        text = AutoTokenizer.from_pretrained(tiny_model).decode(samples[0].tokens)
        assert '"name": "add"' in text


def test_a_missing_extra_stops_the_run_naming_it(monkeypatch, tiny_model, tmp_path):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # as if not installed: importing it raises
    with pytest.raises(ValueError, match=r"pip install 'slimeish\[verifiers\]'"):
        VerifiersConfig(env_id="x").check()
    argv = ["train", "--model-path", str(tiny_model), "--run-dir", str(tmp_path / "run"), "--prompt-data",
            str(tmp_path / "p.jsonl"), "--rollout-function-path", ADAPTER, "--env-id", "x"]  # fmt: skip
    with pytest.raises(ValueError, match=r"pip install 'slimeish\[verifiers\]'"):
        main(argv)  # `slimeish train` stops in its plugin checks, before any process starts
    assert not (tmp_path / "run" / "logs").exists()  # no engine, router or buffer was started
