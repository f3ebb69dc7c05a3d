"""The demo task: prompt sets, tools, reward, and the SFT transcripts' token masks."""

import json
import random
from collections import Counter

import pytest

from examples.demo.sft import INVERSE, SFTConfig, episode_messages, render_with_mask, teacher_tool
from examples.demo.task import (
    OPS,
    TOOLS,
    Problem,
    TaskConfig,
    call_tool,
    make_splits,
    parse_answer,
    reward,
    write_datasets,
)


def test_splits_are_deterministic_and_disjoint():
    cfg = TaskConfig(n_train=300, n_eval=40, data_seed=3)
    train, eval_ = make_splits(cfg)
    assert (train, eval_) == make_splits(cfg)
    assert make_splits(TaskConfig(n_train=300, n_eval=40, data_seed=4)) != (train, eval_)
    assert len(train) == 300 and len(eval_) == len(set(eval_)) == 40
    assert not set(train) & set(eval_)
    assert {p.op for p in eval_} == set(OPS)


def test_labels_are_what_the_right_tool_returns():
    train, _ = make_splits(TaskConfig(n_train=200, n_eval=8))
    expected = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
    for p in train:
        assert isinstance(p.label, int)
        if p.op == "divided by":
            assert p.a == p.label * p.b
        else:
            assert p.label == expected[p.op](p.a, p.b)


def test_jsonl_records(tmp_path):
    train_path, eval_path = write_datasets(tmp_path, TaskConfig(n_train=5, n_eval=3))
    rows = [json.loads(line) for line in eval_path.read_text().splitlines()]
    assert len(rows) == 3 and len(train_path.read_text().splitlines()) == 5
    meta = rows[0]["metadata"]
    assert rows[0]["prompt"] == Problem(meta["op"], meta["a"], meta["b"]).question
    assert rows[0]["label"] == Problem(meta["op"], meta["a"], meta["b"]).label


@pytest.mark.parametrize(
    "name, args, result",
    [("add", {"a": 17, "b": 25}, 42), ("sub", {"a": 3, "b": 5}, -2), ("mul", {"a": 6, "b": 7}, 42),
     ("div", {"a": 84, "b": 7}, 12), ("div", {"a": 10, "b": 3}, 3.33)],
)  # fmt: skip
def test_tools(name, args, result):
    assert call_tool(name, args) == result


@pytest.mark.parametrize(
    "name, args, match",
    [("power", {"a": 1, "b": 2}, "unknown tool"), ("add", {"a": "1", "b": 2}, "numeric"),
     ("add", {"a": 1}, "numeric"), ("add", {"a": True, "b": 2}, "numeric"), ("div", {"a": 1, "b": 0}, "zero")],
)  # fmt: skip
def test_tool_errors(name, args, match):
    with pytest.raises(ValueError, match=match):
        call_tool(name, args)


@pytest.mark.parametrize(
    "text, value",
    [("The answer is 42.", 1.0), (" The answer is 42.\n", 1.0), ("The answer is 43.", 0.0),
     ("The answer is 42", 0.0), ("42", 0.0), ("The answer is 42. Really.", 0.0), (None, 0.0), ("", 0.0),
     ('<tool_call>\n{"name": "add", "arguments": {"a": 4', 0.0)],
)  # fmt: skip
def test_reward(text, value):
    assert reward(text, 42) == value


def test_parse_answer_negative_and_decimal():
    assert parse_answer("The answer is -2.") == -2.0
    assert parse_answer("The answer is 3.33.") == 3.33


def test_tools_are_openai_function_tools():
    assert [t["function"]["name"] for t in TOOLS] == list(OPS.values())
    assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in TOOLS)


def test_sft_transcript_masks_exactly_the_assistant_tokens(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    messages = episode_messages(Problem("plus", 7, 5), "mul")  # a wrong tool: the answer follows the tool
    ids, mask = render_with_mask(tokenizer, messages)
    full = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False).removesuffix("\n")
    assert ids == tokenizer(full, add_special_tokens=False)["input_ids"]
    assistant = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    call = '<tool_call>\n{"name": "mul", "arguments": {"a": 7, "b": 5}}\n</tool_call>'
    assert assistant == f"{call}<|im_end|>The answer is 35.<|im_end|>"
    short_ids, short_mask = render_with_mask(tokenizer, messages, tools=None)  # the warm-start's phase 1
    assert [t for t, m in zip(short_ids, short_mask, strict=True) if m] == [
        t for t, m in zip(ids, mask, strict=True) if m
    ]
    assert len(short_ids) * 4 < len(ids)


def test_sloppy_teacher_mostly_picks_the_inverse_tool():
    # The warm-start's start point depends on this mix: right 20 %, inverse 50 %, the other two 15 % each.
    rng, cfg = random.Random(0), SFTConfig(teacher_right=0.2, teacher_inverse=0.5)
    for op, tool in OPS.items():
        picks = Counter(teacher_tool(Problem(op, 8, 2), rng, cfg) for _ in range(4000))
        others = [t for t in OPS.values() if t not in (tool, INVERSE[tool])]
        assert picks[tool] / 4000 == pytest.approx(0.2, abs=0.03)
        assert picks[INVERSE[tool]] / 4000 == pytest.approx(0.5, abs=0.03)
        assert all(picks[t] / 4000 == pytest.approx(0.15, abs=0.03) for t in others)


def test_demo_recipe_is_a_valid_train_command(tmp_path):
    from examples.demo.run import DemoConfig, train_setup
    from slimeish.train.setup import check_plugins, command_line, parse_args

    cfg = DemoConfig(run_dir=tmp_path)
    setup = train_setup(cfg, tmp_path / "train.jsonl", tmp_path / "eval.jsonl", tmp_path / "warm")
    assert parse_args(command_line(setup)) == setup  # the same run as a `slimeish train` command
    check_plugins(setup)  # the agent and rollout function load with the signatures they need
    assert setup.rollout.rollout_batch_size * setup.rollout.n_samples_per_prompt == 128
    assert setup.rollout.eval_temperature == 0.0  # greedy held-out eval; training samples at T=1
    assert setup.rollout.rollout_temperature == 1.0
    assert setup.trainer.lr == cfg.lr and setup.trainer.min_lr == cfg.min_lr
    assert setup.trainer.lr_decay_style == "cosine" and setup.run.num_rollout == cfg.num_rollout
    assert setup.loss.kl_coef == cfg.kl_coef > 0
