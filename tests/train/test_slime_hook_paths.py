"""slime's rollout-side `--*-path` hooks (slimeish.train.slime_hooks): each loaded with slime's
signature at start-up and called where slime calls it, with its effect asserted."""

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from slimeish.common.sample import Sample
from slimeish.data import DataSource
from slimeish.rollout import RolloutFnEvalOutput
from slimeish.rollout_functions.token_in import generate_rollout
from slimeish.train.checkpoint import resume, save
from slimeish.train.collect import evaluate
from slimeish.train.loop import train_and_sync, train_or_log
from slimeish.train.parts import train_source
from slimeish.train.setup import check_plugins, parse_args, plugin_args
from slimeish.train.slime_hooks import SlimeHooks, SlimeHooksConfig
from tests.demo.conftest import router, stand_in_router  # noqa: F401  (the stand-in router fixture)
from tests.demo.test_openai_agent import make_args

HERE = __name__
SEEN: dict[str, object] = {}


# --- plugins with slime's signatures ---------------------------------------------------------


def eval_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(1)
    SEEN["eval_prompts"] = [s.prompt for g in groups for s in g]
    return RolloutFnEvalOutput(data={"math": {"rewards": [0.25, 0.75]}}, metrics={"pass@1": 0.5})


def failing_rollout(args, rollout_id, data_source, evaluation=False):
    raise AssertionError("evaluation must call --eval-function-path, not the rollout function")


def drop_short(args, samples):
    for group in samples:
        for sample in group:
            sample.remove_sample = sample.response_length < 3


def log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    SEEN["rollout_log"] = (rollout_id, len(samples), rollout_extra_metrics, rollout_time)
    return True


def log_rollout_and_keep_defaults(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    return False


def log_eval_rollout_data(rollout_id, args, data, extra_metrics):
    SEEN["eval_log"] = (rollout_id, data, extra_metrics)
    return True


async def fixed_generate(args, sample, sampling_params):
    sample.response, sample.status = "draft", Sample.Status.COMPLETED
    return sample


def uppercase(args, sample, *, rollout_id=None, evaluation=False):
    sample.response = sample.response.upper()  # edited in place: None keeps it
    SEEN.setdefault("hooked", []).append((rollout_id, evaluation))


async def tagged(args, sample, *, rollout_id=None, evaluation=False):
    return Sample(**{**sample.__dict__, "response": sample.response + "!"})  # a new sample replaces it


async def exact_answer(args, sample):
    return float(sample.response == "DRAFT!")


def no_keywords(args, sample):
    return None


class CountingSource:
    """slime's data source interface: groups of n copies of "q0", "q1", ..."""

    def __init__(self, args):
        self.n, self.next, self.saved, self.added = args.n_samples_per_prompt, 0, [], []

    def get_samples(self, num_samples):
        groups = [[Sample(prompt=f"q{self.next + g}") for _ in range(self.n)] for g in range(num_samples)]
        self.next += num_samples
        return groups

    def add_samples(self, samples):
        self.added += samples

    def save(self, rollout_id):
        self.saved.append(rollout_id)

    def load(self, rollout_id=None):
        self.next = 100 * rollout_id


class NotASource:
    def __init__(self, args):
        self.args = args


def wrong_hook(args):  # one parameter: fits no hook
    return True


# --- helpers ---------------------------------------------------------------------------------


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    (tmp_path / "run").mkdir(exist_ok=True)
    return ["--model-path", str(tmp_path), "--prompt-data", str(data), "--run-dir", str(tmp_path / "run"), *extra]


def _sample(index: int, length: int, reward: float) -> Sample:
    return Sample(index=index, tokens=[1] * (2 + length), response_length=length, loss_mask=[1] * length, reward=reward)


# --- --rollout-sample-hook-path, in token_in before the reward -------------------------------


def test_sample_hooks_run_in_order_before_the_reward(router):  # noqa: F811
    SEEN.pop("hooked", None)
    hooks = [f"{HERE}.uppercase", f"{HERE}.tagged"]
    plugins = {"custom_generate_function_path": f"{HERE}.fixed_generate", "custom_rm_path": f"{HERE}.exact_answer"}
    args = make_args(router, rollout_batch_size=1, n_samples_per_prompt=2, rollout_sample_hook_path=hooks, **plugins)
    groups = DataSource([Sample(prompt="q")], 2, shuffle=False)
    out = generate_rollout(args, 5, groups)
    assert [(s.response, s.reward) for s in out.samples[0]] == [("DRAFT!", 1.0)] * 2
    assert SEEN["hooked"] == [(5, False)] * 2


def test_a_sample_hook_without_slimes_keywords_stops_at_start_up(tmp_path):
    setup = parse_args(_argv(tmp_path, "--rollout-sample-hook-path", f"{HERE}.no_keywords"))
    with pytest.raises(ValueError, match="rollout_id=None, evaluation=False"):
        check_plugins(setup)


# --- --custom-config-path ----------------------------------------------------------------------


def test_custom_config_keys_land_on_args_over_the_flags(tmp_path):
    custom = tmp_path / "custom.yaml"
    custom.write_text("max_turns: 3\ntool_url: http://tools:1\nrollout_batch_size: 5\n")
    setup = parse_args(_argv(tmp_path, "--rollout-batch-size", "2", "--custom-config-path", str(custom)))
    assert setup.rollout.rollout_batch_size == 5  # slime sets its keys over the flags
    args = plugin_args(setup, "http://127.0.0.1:9", "t")
    assert (args.max_turns, args.tool_url, args.rollout_batch_size) == (3, "http://tools:1", 5)


def test_the_config_yaml_takes_a_custom_config_path_and_its_keys_are_not_options(tmp_path):
    custom = tmp_path / "custom.yaml"
    custom.write_text("my_plugin_option: 7\n")
    config = tmp_path / "run.yaml"
    config.write_text(f"custom_config_path: {custom}\n")
    args = plugin_args(parse_args(_argv(tmp_path, "--config", str(config))), "http://127.0.0.1:9", "t")
    assert args.my_plugin_option == 7


def test_a_missing_custom_config_stops_at_start_up(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(_argv(tmp_path, "--custom-config-path", str(tmp_path / "nope.yaml")))
    assert exc.value.code == 2 and "nope.yaml" in capsys.readouterr().err


# --- --data-source-path ------------------------------------------------------------------------


def test_a_data_source_feeds_the_prompts_numbered_and_regenerated_by_slimeish(tmp_path):
    setup = parse_args(_argv(tmp_path, "--n-samples-per-prompt", "2", "--data-source-path", f"{HERE}.CountingSource"))
    check_plugins(setup)
    data = train_source(setup, plugin_args(setup, "http://127.0.0.1:9", "t"))
    groups = data.get_samples(2)
    assert [[(s.prompt, s.group_index, s.index) for s in g] for g in groups] == [
        [("q0", 0, 0), ("q0", 0, 1)],
        [("q1", 1, 0), ("q1", 1, 1)],
    ]
    data.regenerate(0, [1], "q0")  # a reopened group's stale member comes back first
    assert [(s.prompt, s.group_index, s.index) for g in data.get_samples(2) for s in g] == [
        ("q0", 0, 1), ("q2", 2, 0), ("q2", 2, 1)
    ]  # fmt: skip
    data.add_samples([groups[0]])
    assert data.source.added == groups[0:1]


def test_a_data_source_saves_and_loads_its_state_with_the_checkpoints(tmp_path):
    setup = parse_args(_argv(tmp_path, "--n-samples-per-prompt", "1", "--data-source-path", f"{HERE}.CountingSource"))
    data = train_source(setup, plugin_args(setup, "http://127.0.0.1:9", "t"))
    trainer = SimpleNamespace(
        save=lambda path, data_state: SEEN.update(state=data_state), load=lambda path: SEEN["state"]
    )
    (tmp_path / "ckpt").mkdir()
    save(trainer, data, tmp_path / "ckpt", 3, [])
    assert data.source.saved == [3]
    assert resume(trainer, data, tmp_path / "ckpt" / "latest")[0] == 3
    assert data.get_samples(1)[0][0].prompt == "q300"  # the plugin's own state, loaded for step 3


def test_a_class_without_the_data_source_methods_stops_at_start_up(tmp_path):
    setup = parse_args(_argv(tmp_path, "--data-source-path", f"{HERE}.NotASource"))
    with pytest.raises(ValueError, match="not a data source class"):
        check_plugins(setup)


# --- --eval-function-path and --custom-eval-rollout-log-function-path ------------------------------


def _eval_data() -> DataSource:
    return DataSource([Sample(prompt="2+2?"), Sample(prompt="3+3?")], 2, shuffle=False)


def test_evaluation_calls_the_eval_function_and_logs_its_metrics():
    hooks = SlimeHooks.load(SlimeHooksConfig(eval_function_path=f"{HERE}.eval_rollout"))
    metrics = asyncio.run(evaluate(failing_rollout, SimpleNamespace(), _eval_data(), 4, hooks))
    assert SEEN["eval_prompts"] == ["2+2?", "2+2?"]  # it drew from the eval data source
    assert metrics == {"eval/reward_mean": 0.5, "eval/pass@1": 0.5}


def test_an_eval_log_function_returning_true_replaces_the_default_eval_metrics():
    hooks = SlimeHooks.load(
        SlimeHooksConfig(
            eval_function_path=f"{HERE}.eval_rollout",
            custom_eval_rollout_log_function_path=f"{HERE}.log_eval_rollout_data",
        )
    )
    assert asyncio.run(evaluate(failing_rollout, SimpleNamespace(), _eval_data(), 4, hooks)) == {}
    assert SEEN["eval_log"] == (4, {"math": {"rewards": [0.25, 0.75]}}, {"pass@1": 0.5})


# --- --rollout-sample-filter-path, at the trainer's step ---------------------------------------


class _Recorder:
    weight_version = 0

    def train_step(self, samples):
        SEEN["trained"] = [(s.index, list(s.loss_mask), s.reward) for s in samples]
        return {"loss": 1.0}


def _parts(hooks: SlimeHooks) -> SimpleNamespace:
    return SimpleNamespace(
        hooks=hooks,
        args=SimpleNamespace(),
        trainer=_Recorder(),
        sync=SimpleNamespace(sync=lambda trainer: {}),
        producer=SimpleNamespace(metrics={}),
        router_counters=SimpleNamespace(delta=dict),
        dynamic_filter=None,
    )


def test_a_sample_filter_leaves_the_samples_it_removes_no_token_to_train_on():
    hooks = SlimeHooks.load(SlimeHooksConfig(rollout_sample_filter_path=f"{HERE}.drop_short"))
    groups = [SimpleNamespace(samples=[_sample(0, 2, 1.0), _sample(1, 4, 0.0)])]
    asyncio.run(train_and_sync(_parts(hooks), groups))  # type: ignore[arg-type]
    # The removed sample stays in the batch (its reward still counts in the group's advantages).
    assert SEEN["trained"] == [(0, [0, 0], 1.0), (1, [1, 1, 1, 1], 0.0)]


def test_without_a_sample_filter_every_sample_trains():
    groups = [SimpleNamespace(samples=[_sample(0, 2, 1.0)])]
    asyncio.run(train_and_sync(_parts(SlimeHooks()), groups))  # type: ignore[arg-type]
    assert SEEN["trained"] == [(0, [1, 1], 1.0)]


def test_debug_rollout_only_logs_the_groups_and_never_trains():
    parts = _parts(SlimeHooks())
    parts.trainer.train_step = None  # calling it would fail the test
    parts.sync = None
    groups = [SimpleNamespace(samples=[_sample(0, 2, 1.0), _sample(1, 4, 0.0)])]
    metrics = asyncio.run(train_or_log(parts, groups, rollout_only=True))  # type: ignore[arg-type]
    assert metrics["rollout/reward_mean"] == 0.5 and metrics["rollout/samples"] == 2.0
    assert not any(k.startswith(("train/", "time/")) for k in metrics)


# --- --custom-rollout-log-function-path ----------------------------------------------------


def test_a_rollout_log_function_returning_true_leaves_out_the_default_rollout_metrics():
    hooks = SlimeHooks.load(SlimeHooksConfig(custom_rollout_log_function_path=f"{HERE}.log_rollout_data"))
    metrics = {"rollout/reward_mean": 0.5, "perf/tok_s": 9.0, "episodes/failed": 1.0, "train/loss": 0.1}
    logged = hooks.log_rollout(3, SimpleNamespace(), [Sample(), Sample()], metrics, 1.5)
    assert logged == {"train/loss": 0.1}
    assert SEEN["rollout_log"] == (3, 2, {"episodes/failed": 1.0}, 1.5)


def test_a_rollout_log_function_returning_false_keeps_them():
    hooks = SlimeHooks.load(SlimeHooksConfig(custom_rollout_log_function_path=f"{HERE}.log_rollout_and_keep_defaults"))
    metrics = {"rollout/reward_mean": 0.5, "train/loss": 0.1}
    assert hooks.log_rollout(0, SimpleNamespace(), [], metrics, 0.0) == metrics


# --- start-up checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--custom-rollout-log-function-path", "def log_rollout_data(rollout_id, args, samples"),
        ("--custom-eval-rollout-log-function-path", "def log_eval_rollout_data(rollout_id, args, data"),
        ("--rollout-sample-filter-path", "def filter(args, samples"),
        ("--eval-function-path", "def generate_rollout(args, rollout_id"),
        ("--custom-advantage-function-path", "def custom_fn(args, rollout_data"),
        (
            "--weight-sync disk --custom-update-weight-post-write-path",
            "def hook(args, version_dir: str, rollout_engines",
        ),
        ("--rollout-data-postprocess-path", "def postprocess(args, rollout_id: int, rollout_data"),
        ("--custom-megatron-before-log-prob-hook-path", "def hook(args, model, store_prefix"),
        ("--custom-megatron-before-train-step-hook-path", "def hook(args, rollout_id, step_id, model, optimizer"),
    ],
)
def test_a_hook_with_the_wrong_signature_stops_the_run_naming_the_expected_one(tmp_path, flag, expected):
    setup = parse_args(_argv(tmp_path, *flag.split(), f"{HERE}.wrong_hook"))
    with pytest.raises(ValueError, match="wrong signature") as exc:
        check_plugins(setup)
    assert expected in str(exc.value)
