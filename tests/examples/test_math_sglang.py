"""examples/math_sglang: the problem generator, the reward parser, and the command it builds."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from examples.math_sglang.data import INSTRUCTION, MathDataConfig, make_splits, write_datasets
from examples.math_sglang.reward import final_number, reward, score
from examples.math_sglang.run import MathRunConfig, check_engines, train_setup
from slimeish.common.sample import Sample

# Each template's answer, recomputed from the numbers in its question text (in order of appearance).
RECOMPUTE = {
    "buy_and_give": lambda a, b, c: a + b - c,
    "boxes": lambda a, b: a * b,
    "share": lambda total, friends: total // friends,
    "reading": lambda a, b, c: a * b + c,
    "shop": lambda stock, a, b: stock - a - b,
}


def test_labels_match_the_question_text():
    train, eval_ = make_splits(MathDataConfig(n_train=500, n_eval=50, max_value=30))
    assert {p.template for p in train} == set(RECOMPUTE)
    for p in train + eval_:
        numbers = [int(x) for x in re.findall(r"\d+", p.question)]
        assert p.answer == RECOMPUTE[p.template](*numbers), p
        assert p.answer >= 0
        if p.template == "share":
            assert numbers[0] % numbers[1] == 0, "a share must divide exactly"


def test_splits_are_disjoint_and_deterministic():
    cfg = MathDataConfig(n_train=300, n_eval=40)
    train, eval_ = make_splits(cfg)
    assert len(train) == 300 and len(eval_) == 40
    assert not {p.question for p in train} & {p.question for p in eval_}
    assert make_splits(cfg) == (train, eval_)
    assert make_splits(MathDataConfig(n_train=300, n_eval=40, data_seed=1))[0] != train
    with pytest.raises(ValueError, match="max-value"):
        make_splits(MathDataConfig(max_value=1))


def test_jsonl_records(tmp_path):
    train_path, eval_path = write_datasets(tmp_path, MathDataConfig(n_train=3, n_eval=2))
    rows = [json.loads(line) for line in train_path.read_text().splitlines()]
    assert len(rows) == 3 and len(eval_path.read_text().splitlines()) == 2
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(INSTRUCTION)
        assert isinstance(row["label"], int) and row["metadata"]["template"] in RECOMPUTE


@pytest.mark.parametrize(
    "text, number",
    [
        ("3 + 4 = 7, so the answer is \\boxed{7}.", 7.0),
        ("\\boxed{1,234}", 1234.0),
        ("\\boxed{\\text{12 apples}} (not 5)", 12.0),  # nested braces; the box wins over later numbers
        ("\\boxed{3} then \\boxed{4}", 4.0),  # the last box
        ("\\boxed{}", None),  # an empty box states nothing
        ("12 - 5 = 7. The answer is 7. Check: 7 + 5 = 12", 7.0),  # "answer is" beats the last number
        ("Answer: -3", -3.0),
        ("The answer is \u22124.", -4.0),  # Unicode minus
        ("It costs $15.00 in total", 15.0),
        ("12-5=7", 7.0),  # a minus between digits is an operator
        ("I have 3, 4 and 10", 10.0),  # "3, 4" is a list, not a thousands separator
        ("5 boxes hold \\boxed{40", 40.0),  # a box cut off by the length limit: last number
        ("no digits here", None),
        ("", None),
        (None, None),
    ],
)
def test_final_number(text, number):
    assert final_number(text) == number


def test_score_and_reward_hook():
    assert score("\\boxed{12}", 12) == 1.0
    assert score("The answer is 12.0", "12") == 1.0
    assert score("\\boxed{13}", 12) == 0.0
    assert score("nothing", 12) == 0.0
    sample = Sample(prompt="p", label=35, response="89 - 7 - 47 = 35\n\\boxed{35}")
    assert asyncio.run(reward(None, sample)) == 1.0


def test_cpu_command_uses_the_embedded_engine(tmp_path, tiny_model):
    setup = train_setup(MathRunConfig(run_dir=tmp_path / "run", model_path=tiny_model), ["--lr", "3e-5"])
    assert setup.stack.engine_url == [] and setup.trainer.device == "cpu"  # the CPU preset
    assert (setup.rollout.rollout_batch_size, setup.rollout.n_samples_per_prompt) == (2, 4)
    assert setup.rollout.rollout_max_response_len == 16
    assert setup.trainer.lr == 3e-5  # the user's flags come last, so they win
    assert setup.run.num_rollout == 2
    assert setup.rollout.custom_rm_path == "examples.math_sglang.reward.reward"
    assert (tmp_path / "run" / "data" / "train.jsonl").exists()


def test_gpu_command_points_at_sglang(tmp_path):
    cfg = MathRunConfig(engine_url=["http://a:30000", "http://b:30000"], model_path=tmp_path / "m", run_dir=tmp_path)
    setup = train_setup(cfg, [])
    assert setup.stack.engine_url == ["http://a:30000", "http://b:30000"]
    assert (setup.rollout.rollout_batch_size, setup.rollout.n_samples_per_prompt) == (32, 8)  # the GPU preset
    assert setup.loss.tis and setup.trainer.dtype == "bfloat16" and setup.run.mode == "sync"
    assert setup.run.weight_sync == "disk" and setup.trainer.device == "cuda"
    assert setup.run.run_dir == tmp_path.resolve()  # SGLang reads exported weights by this path
    with pytest.raises(SystemExit, match="--model-path is required"):
        train_setup(MathRunConfig(engine_url=["http://a:30000"], run_dir=tmp_path), [])


def test_engine_check_wants_integer_weight_versions(server):
    check_engines([server.url])
    server.weight_version = "default"  # SGLang's own default
    with pytest.raises(SystemExit, match="--weight-version 0"):
        check_engines([server.url])
    with pytest.raises(SystemExit, match="is the server running"):
        check_engines(["http://127.0.0.1:9"])
