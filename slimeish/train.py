"""`slimeish train`: start the parts, then generate → train → sync weights, in one loop.

Sync mode runs the three phases in turn. Async mode keeps episodes running while the trainer
trains: the producer streams groups, keeping at most `--async-groups` (default
`2 * (max_staleness + 1) * rollout_batch_size`) generated but not yet trained; weights update in
place (pause → flush → update → continue, no request aborted), and the buffer never hands out a
group with a member older than `--max-staleness` versions: it reopens the group, and those
members come back through the regeneration queue to be generated again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from slimeish.buffer.client import Buffer
from slimeish.buffer.config import BufferConfig
from slimeish.buffer.records import Group
from slimeish.common.config import add_dataclass_args, from_namespace, help_field, load_yaml
from slimeish.common.sample import Sample
from slimeish.data import DataConfig, DataSource, read_prompts
from slimeish.launch import Stack, StackConfig
from slimeish.producer import RolloutProducer
from slimeish.rollout import RolloutConfig, load_generate_function, load_reward_function, load_rollout_function
from slimeish.run_metrics import MetricsLogger, RouterCounters, drop_steps_from
from slimeish.trainer.config import LossConfig, TrainerConfig

log = logging.getLogger("slimeish.train")
CONSUMER = "trainer"


@dataclass(kw_only=True)
class RunConfig:
    run_dir: Path = help_field(Path("runs/latest"), help="directory for logs, checkpoints, metrics and the buffer")
    run_id: str | None = help_field(None, help="buffer namespace of this run (default: the run dir's name)")
    mode: Literal["sync", "async"] = help_field("sync", help="sync: generate, then train; async: both at once")
    num_rollout: int = help_field(10, help="rollout steps (one training step each)")
    eval_interval: int | None = help_field(None, help="evaluate on --eval-prompt-data every N steps (and first/last)")
    save_interval: int | None = help_field(None, help="save a checkpoint every N steps (and at the end)")
    load: Path | None = help_field(None, help="resume from this checkpoint directory (a run's checkpoints/latest)")
    async_groups: int | None = help_field(
        None,
        help="async mode: most groups generated but not yet trained (default: 2 x (max_staleness + 1) x "
        "rollout_batch_size); --rollout-concurrency still bounds the episodes, and the slack keeps episode "
        "slots busy with other groups while a group's slowest member runs",
    )
    weight_sync: Literal["tensor", "disk", "distributed"] = help_field(
        "tensor",
        help="tensor: same-host shared-memory update (embedded engines); disk: export an HF checkpoint the "
        "engines load (SGLang: a shared filesystem); distributed: NCCL broadcast to SGLang engines (GPU)",
    )


CONFIGS = {
    "run": RunConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "buffer": BufferConfig,
    "stack": StackConfig,
    "trainer": TrainerConfig,
    "loss": LossConfig,
}


@dataclass
class TrainSetup:
    run: RunConfig
    data: DataConfig
    rollout: RolloutConfig
    buffer: BufferConfig
    stack: StackConfig
    trainer: TrainerConfig
    loss: LossConfig


def parse_args(argv: list[str] | None) -> TrainSetup:
    parser = argparse.ArgumentParser(prog="slimeish train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="YAML file with any of the options below (flags win)")
    for name, cls in CONFIGS.items():
        add_dataclass_args(parser, cls, name)
    ns = parser.parse_args(argv)
    base = load_yaml(ns.config) if ns.config else {}
    unknown = set(base) - {f for cls in CONFIGS.values() for f in cls.__dataclass_fields__}
    if unknown:
        parser.error(f"{ns.config}: unknown option(s) {', '.join(sorted(unknown))}")
    try:
        setup = TrainSetup(**{name: from_namespace(cls, ns, base) for name, cls in CONFIGS.items()})
    except ValueError as exc:
        parser.error(str(exc))
    if setup.data.prompt_data is None:  # checked here, before any process is started
        parser.error("--prompt-data is required")
    return setup


class PluginArgs(argparse.Namespace):
    """The `args` rollout plugins receive: every config field under slime's names, plus where the
    router is. A copy per run: plugins may read it freely; changes do not reach the configs."""

    def __init__(self, setup: TrainSetup, stack: Stack):
        fields = {k: v for cfg in vars(setup).values() for k, v in _fields(cfg).items()}
        host, _, port = stack.router_url.removeprefix("http://").partition(":")
        fields |= {
            "hf_checkpoint": str(setup.trainer.model_path),
            "router_url": stack.router_url,
            "admin_token": stack.admin_token,
            "sglang_router_ip": host,
            "sglang_router_port": int(port),
        }
        super().__init__(**fields)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress bar
    setup = parse_args(argv)
    check_plugins(setup.rollout)  # before any process starts: a wrong plugin fails in a second
    setup.run.run_dir.mkdir(parents=True, exist_ok=True)
    run_id = setup.run.run_id or setup.run.run_dir.resolve().name
    (setup.run.run_dir / "config.json").write_text(json.dumps(_jsonable(setup), indent=2))
    stack = Stack(
        setup.stack, model_path=setup.trainer.model_path, run_dir=setup.run.run_dir, run_id=run_id,
        weight_sync=setup.run.weight_sync,
    )  # fmt: skip
    with stack:
        try:
            asyncio.run(train(setup, stack, run_id))
        except KeyboardInterrupt:
            log.warning("interrupted: stopping every child process")


def check_plugins(cfg: RolloutConfig) -> None:
    """Import every configured hook and check its signature (errors state the expected one)."""
    load_rollout_function(cfg.rollout_function_path)
    if cfg.custom_generate_function_path:
        load_generate_function(cfg.custom_generate_function_path)
    if cfg.custom_rm_path:
        load_reward_function(cfg.custom_rm_path)
    if cfg.agent_function_path:
        from slimeish.rollout_functions.openai_agent import load_agent_function

        load_agent_function(cfg.agent_function_path)


async def train(setup: TrainSetup, stack: Stack, run_id: str) -> None:
    from slimeish.trainer.trainer import Trainer
    from slimeish.trainer.weight_sync import WeightSync

    run, n_groups = setup.run, setup.rollout.rollout_batch_size
    args = PluginArgs(setup, stack)
    rollout_fn = load_rollout_function(setup.rollout.rollout_function_path)
    data, eval_data = _train_source(setup), _eval_source(setup)
    trainer = await asyncio.to_thread(Trainer, setup.trainer, setup.loss)
    start, saved = await asyncio.to_thread(_resume, trainer, data, run.load)
    logger = MetricsLogger(run.run_dir, keep_before=start)
    router_counters = await asyncio.to_thread(RouterCounters, stack.router_url)
    ledger = TrainedGroups(run.run_dir / "trained_groups.jsonl", keep_before=start)
    unacked: list[str] = []  # trained since the last checkpoint; acknowledged once it is saved
    with WeightSync(_sync_config(run, stack)) as sync, contextlib.closing(logger):
        # Before any rollout the engines serve the trainer's version: a resumed run's, or a fresh
        # one's where long-lived engines still serve an earlier run's (whose higher version would make
        # every token look stale). Engines started from --model-path already do, and a sync on disk
        # or NCCL would export the whole model for nothing.
        if not await asyncio.to_thread(sync.serves, trainer.weight_version):
            await asyncio.to_thread(sync.sync, trainer)
        async with Buffer(stack.buffer_url, run_id, setup.buffer) as buffer:
            await buffer.ack(saved.get("unacked_groups", []))  # saved, then killed before the ack
            if start:  # groups the killed run was still generating are finished, not lost
                await buffer.note_resume(trainer.weight_version)
                recovered = await buffer.recover_open_groups()
                log.info("resume: %d open groups queued to finish their missing members", len(recovered))
            producer = RolloutProducer(rollout_fn, args, data, buffer)
            if run.mode == "async":
                # Twice the groups one staleness window trains: with heavy-tailed episodes, 1x leaves
                # about half the episode slots idle behind slow members (docs/benchmarks.md).
                window = run.async_groups or 2 * ((setup.buffer.max_staleness or 0) + 1) * n_groups
                producer.start(max_groups=window)
            try:
                progress = tqdm(range(start, run.num_rollout), initial=start, total=run.num_rollout, desc="rollout")
                for step in progress:
                    metrics: dict[str, Any] = {}
                    if run.eval_interval and (step == start or step % run.eval_interval == 0):
                        metrics |= await evaluate(rollout_fn, args, eval_data, step)
                    skipped = buffer.skipped.copy()
                    with timed(metrics, "time/rollout"):
                        groups = await collect_groups(buffer, producer, n_groups, trainer.weight_version, run.mode)
                    metrics |= {f"buffer/{name}": float(n - skipped[name]) for name, n in buffer.skipped.items()}
                    samples = [s for g in groups for s in g.samples]
                    metrics |= batch_metrics(samples, trainer.weight_version)
                    with timed(metrics, "time/train"):
                        metrics |= prefixed("train", await asyncio.to_thread(trainer.train_step, samples))
                    with timed(metrics, "time/sync"):
                        metrics |= prefixed("time/sync", await asyncio.to_thread(sync.sync, trainer))
                    metrics |= producer.metrics | await asyncio.to_thread(router_counters.delta)
                    step_s = metrics["time/rollout"] + metrics["time/train"] + metrics["time/sync"]
                    metrics["perf/sampled_tokens_per_s"] = metrics.get("rollout/sampled_tokens", 0.0) / step_s
                    unacked += ledger.record(step, groups)
                    if step + 1 == run.num_rollout or (run.save_interval and (step + 1) % run.save_interval == 0):
                        ckpt = run.run_dir / "checkpoints"
                        await asyncio.to_thread(_save, trainer, data, ckpt, step + 1, unacked)
                        await buffer.ack(unacked)  # a crash before the save re-delivers them
                        unacked = []
                    progress.write(logger.log(step, metrics))
                if run.eval_interval:
                    final = await evaluate(rollout_fn, args, eval_data, run.num_rollout)
                    progress.write(logger.log(run.num_rollout, final))
            finally:
                await producer.stop()
                logger.plot_rewards()


# Sync mode gives up after this many rollout batches in a row yield no trainable group.
MAX_EMPTY_BATCHES = 5


async def collect_groups(buffer: Buffer, producer: RolloutProducer, n: int, version: int, mode: str) -> list[Group]:
    """`n` trainable groups. Whatever is ready is taken first (groups re-delivered after a crash);
    only then does sync mode generate the groups still missing (exactly those, so no surplus is
    left to be trained a version later), and async mode wait for the producer. Async slots are
    freed for taken, dropped and reopened groups alike."""
    groups: list[Group] = []
    empty_batches = 0
    while len(groups) < n:
        producer.raise_if_failed()
        skipped_before = buffer.groups_skipped
        taken = await buffer.take_groups(n - len(groups), CONSUMER, version)
        producer.release(len(taken) + buffer.groups_skipped - skipped_before)
        groups += taken
        if taken:
            empty_batches = 0
            continue
        if mode == "async":
            await asyncio.sleep(0.05)
            continue
        if empty_batches == MAX_EMPTY_BATCHES:
            raise RuntimeError(
                f"{MAX_EMPTY_BATCHES} rollout batches in a row gave no trainable group: every group failed or was "
                "filtered (see episodes/failed in metrics.jsonl, `slimeish buffer stats`, the reward function)"
            )
        await producer.run_once(n - len(groups))
        empty_batches += 1
    return groups


async def evaluate(rollout_fn, args: PluginArgs, eval_data: DataSource | None, step: int) -> dict[str, float]:
    if eval_data is None:
        return {}
    eval_data.load_state({"epoch": 0, "offset": 0, "next_group_index": 0})
    out = await asyncio.to_thread(rollout_fn, args, step, eval_data, True)
    rewards = [r for d in out.data.values() for r in d["rewards"]]
    return {"eval/reward_mean": sum(rewards) / max(len(rewards), 1)} | prefixed("eval", out.metrics)


class TrainedGroups:
    """`trained_groups.jsonl`: which groups each step trained on, the audit trail of exactly-once.

    On resume from step S the lines of steps >= S are dropped: the killed run trained on them,
    but no checkpoint kept that training, and the buffer hands those groups out again."""

    def __init__(self, path: Path, keep_before: int):
        self.path = path
        drop_steps_from(path, keep_before)

    def record(self, step: int, groups: list[Group]) -> list[str]:
        ids = [g.group_id for g in groups]
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "groups": ids}) + "\n")
        return ids


def batch_metrics(samples: list[Sample], version: int) -> dict[str, float]:
    """What the trained batch looked like: rewards, lengths, staleness, capture splits."""
    if not samples:
        return {}
    rewards = [float(s.reward) for s in samples if isinstance(s.reward, (int, float))]
    oldest = [min(s.weight_versions) for s in samples if s.weight_versions]
    splits = Counter(s.split_reason for s in samples if s.split_reason is not None)
    return {
        "rollout/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "rollout/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "rollout/response_length": sum(s.response_length for s in samples) / len(samples),
        "rollout/samples": float(len(samples)),
        "rollout/segments_split": float(sum(splits.values())),
        "rollout/staleness_max": float(version - min(oldest)) if oldest else 0.0,
        "rollout/sampled_tokens": float(sum(sum(s.loss_mask or []) for s in samples)),
    } | {f"rollout/segments_split/{reason}": float(n) for reason, n in splits.items()}


@contextlib.contextmanager
def timed(metrics: dict[str, Any], key: str):
    t0 = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - t0


def prefixed(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}/{k}": v for k, v in values.items()}


def _train_source(setup: TrainSetup) -> DataSource:
    return DataSource(
        read_prompts(setup.data.prompt_data, setup.data),
        setup.rollout.n_samples_per_prompt,
        shuffle=setup.data.shuffle,
        seed=setup.data.shuffle_seed,
        state_path=setup.run.run_dir / "data_state.json",
    )


def _eval_source(setup: TrainSetup) -> DataSource | None:
    if setup.data.eval_prompt_data is None:
        return None
    prompts = read_prompts(setup.data.eval_prompt_data, setup.data)
    return DataSource(prompts, setup.rollout.n_samples_per_eval_prompt, shuffle=False)


def _save(trainer: Any, data: DataSource, root: Path, step: int, unacked: list[str]) -> None:
    """Checkpoint, recording the groups it holds that the buffer has not acknowledged yet."""
    state = {"rollout_step": step, "unacked_groups": list(unacked), **data.state()}
    trainer.save(root / f"step_{step:06d}", data_state=state)
    tmp = root / "latest.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(f"step_{step:06d}")
    tmp.replace(root / "latest")  # atomic: `latest` always names a complete checkpoint


def _resume(trainer: Any, data: DataSource, load: Path | None) -> tuple[int, dict[str, Any]]:
    """Restore the trainer from `load`; prompts continue after the last ones handed out (the
    run dir's data_state.json), not the checkpoint's: groups opened after the checkpoint are
    still in the buffer and will be trained, so their prompts must not be generated again."""
    if load is None:
        return 0, {}
    state = trainer.load(load)
    drawn = data.state_path and data.state_path.exists() and json.loads(data.state_path.read_text())
    data.load_state(drawn or state)
    return int(state["rollout_step"]), state


def _sync_config(run: RunConfig, stack: Stack) -> Any:
    from slimeish.trainer.weight_sync import WeightSyncConfig

    # The export dir is absolute: engines started elsewhere resolve paths from their own cwd.
    disk_dir = (run.run_dir / "weights").resolve()
    if run.weight_sync == "distributed":  # NCCL groups are per engine: the router cannot fan them out
        return WeightSyncConfig(engine_urls=stack.engine_urls, method="distributed", disk_dir=disk_dir)
    return WeightSyncConfig(
        router_url=stack.router_url, admin_token=stack.admin_token, method=run.weight_sync, disk_dir=disk_dir
    )


def _fields(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _jsonable(setup: TrainSetup) -> dict[str, Any]:
    return {
        name: {k: str(v) if isinstance(v, Path) else v for k, v in _fields(cfg).items()}
        for name, cfg in vars(setup).items()
    }
