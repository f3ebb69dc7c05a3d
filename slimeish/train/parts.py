"""The parts one run's loop drives, started in order and stopped in reverse: the trainer
(resumed from a checkpoint when asked), weight sync, the buffer client, the rollout producer, and
the run's records (metrics, the exactly-once ledger)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slimeish.buffer import Buffer
from slimeish.data import DataSource, read_prompts
from slimeish.rollout import load_rollout_function
from slimeish.rollout.dynamic_filter import DynamicFilter
from slimeish.rollout.run_state import RolloutRun
from slimeish.train.checkpoint import resume
from slimeish.train.launch import RunningStack
from slimeish.train.ledger import TrainedGroups
from slimeish.train.metrics import MetricsLogger, RouterCounters
from slimeish.train.producer import RolloutProducer
from slimeish.train.setup import RunConfig, TrainSetup, plugin_args
from slimeish.train.slime_hooks import PluginDataSource, SlimeHooks, custom_config, load_data_source_class

if TYPE_CHECKING:  # torch and megatron load only once a run starts
    from slimeish.common.sample import Sample
    from slimeish.trainer.weight_sync import WeightSyncConfig

log = logging.getLogger("slimeish.train")


class TrainerHandle(Protocol):
    """What the loop uses of a trainer: a `Trainer` in this process, or `TrainerRanks`."""

    @property
    def weight_version(self) -> int: ...

    def train_step(self, samples: Sequence[Sample]) -> dict[str, float]: ...
    def save(self, out_dir: str | Path, data_state: dict[str, Any] | None = None) -> Path: ...
    def load(self, ckpt_dir: str | Path) -> dict[str, Any]: ...


class SyncHandle(Protocol):
    """What the loop uses of the weight sync: a `WeightSync`, or `RanksSync` (run inside the ranks)."""

    def sync(self, trainer: Any) -> dict[str, float]: ...
    def serves(self, version: int) -> bool: ...
    def unload_adapter(self) -> None: ...


@dataclass
class Parts:
    start: int  # the first step to run: 0, or the resumed checkpoint's
    trainer: TrainerHandle
    sync: SyncHandle
    buffer: Buffer
    producer: RolloutProducer
    data: DataSource
    eval_data: DataSource | None
    rollout_fn: Callable[..., Any]
    args: argparse.Namespace
    logger: MetricsLogger
    router_counters: RouterCounters
    ledger: TrainedGroups
    dynamic_filter: DynamicFilter | None = None
    hooks: SlimeHooks = dataclasses.field(default_factory=SlimeHooks)


class RunAlreadyInBuffer(RuntimeError):
    """A run starting at step 0 into a buffer that holds its earlier groups."""


async def refuse_a_used_buffer(setup: TrainSetup, buffer_url: str, run_id: str) -> None:
    """A run starting at step 0 draws its group ids from the start again: in a buffer that still
    holds this run id's groups (a `--fresh` start, or a restart before the first checkpoint) each
    would be refused as taken, one failed group after another. Refuse the run instead, before the
    trainer starts, and say how to go on."""
    async with Buffer(buffer_url, run_id, setup.buffer) as buffer:
        stats = await buffer.stats()
    held = stats.sessions_open + stats.sessions_finished + stats.sessions_failed
    if held:
        where = f"{setup.run.run_dir / 'buffer'} (the run dir's buffer)" if not setup.stack.buffer_url else buffer_url
        raise RunAlreadyInBuffer(
            f"the buffer at {where} already holds {held} sessions of run {run_id!r} from an earlier start, and "
            f"this one starts at step 0 ({'--fresh' if setup.run.fresh else 'no checkpoint to resume'}), so it would "
            "draw the same group ids again. Resume instead (drop --fresh; a run resumes from its last checkpoint), "
            "start a new run (another --run-dir, or --run-id), or delete the run dir to start this one over."
        )


@contextlib.asynccontextmanager
async def started(setup: TrainSetup, stack: RunningStack, run_id: str) -> AsyncIterator[Parts]:
    run, rollout = setup.run, RolloutRun()
    if run.checkpoint_to_load() is None:
        await refuse_a_used_buffer(setup, stack.buffer_url, run_id)
    args = plugin_args(setup, stack.router_url, stack.admin_token, router_urls=stack.router_urls, rollout_run=rollout)
    rollout_fn = load_rollout_function(setup.rollout.rollout_function_path)
    data, eval_data = train_source(setup, args), eval_source(setup)
    async with trainer_and_sync(setup, stack, run_id) as (trainer, sync):
        if (load := run.checkpoint_to_load()) is not None:
            log.info("resuming from %s", load.resolve())
        start, saved = await asyncio.to_thread(resume, trainer, data, load)
        logger = MetricsLogger(run.run_dir, keep_before=start)
        router_counters = await asyncio.to_thread(RouterCounters, *stack.router_urls)
        ledger = TrainedGroups(run.run_dir / "trained_groups.jsonl", keep_before=start)
        with contextlib.closing(logger):
            # Before any rollout the engines serve the trainer's version: a resumed run's, or a fresh
            # one's where long-lived engines still serve an earlier run's (whose higher version would
            # make every token look stale). Engines started from --model-path already do, and a sync
            # on disk or NCCL would export the whole model for nothing. A LoRA run's adapter is on
            # no engine yet, and every turn asks for it: it is always loaded first (a few MB).
            if setup.trainer.lora_rank or not await asyncio.to_thread(sync.serves, trainer.weight_version):
                await asyncio.to_thread(sync.sync, trainer)
            path = setup.rollout.dynamic_sampling_filter_path
            dynamic_filter = DynamicFilter(path, args) if path else None
            async with Buffer(stack.buffer_url, run_id, setup.buffer, group_filter=dynamic_filter) as buffer:
                await buffer.ack(saved.get("unacked_groups", []))  # saved, then killed before the ack
                if start:  # groups the killed run was still generating are finished, not lost
                    await buffer.note_resume(trainer.weight_version)
                    recovered = await buffer.recover_open_groups()
                    log.info("resume: %d open groups queued to finish their missing members", len(recovered))
                producer = RolloutProducer(rollout_fn, args, data, buffer)
                if run.mode == "async":
                    producer.start(max_groups=async_window(setup))
                parts = Parts(start, trainer, sync, buffer, producer, data, eval_data, rollout_fn, args, logger,
                              router_counters, ledger, dynamic_filter, SlimeHooks.load(setup.slime_hooks))  # fmt: skip
                try:
                    yield parts
                finally:  # first, so no rollout thread left to finish keeps retrying a router
                    rollout.stopping.set()
                    await producer.stop()
                    logger.plot_rewards()
            if setup.trainer.lora_rank:  # the run ended well: its adapter leaves the engines it may share
                await unload_adapter(sync, setup.trainer.lora_name)


@contextlib.asynccontextmanager
async def trainer_and_sync(
    setup: TrainSetup, stack: RunningStack, run_id: str
) -> AsyncIterator[tuple[TrainerHandle, SyncHandle]]:
    """The trainer in this process and its weight sync, or (--trainer-world-size) its rank actors,
    each with its own weight sync (`slimeish.cluster.ranks`)."""
    config = sync_config(setup.run, stack, lora_name=setup.trainer.lora_name)
    hook_args = custom_config(setup.slime_hooks)  # slime's hooks read the custom config's keys on args
    if setup.cluster.trainer_world_size:
        from slimeish.cluster.ranks import RanksSync, TrainerRanks  # Ray is an optional dependency

        ranks = TrainerRanks(
            setup.cluster, setup.trainer, setup.loss, config, run_id=run_id, engine_urls=stack.engine_urls,
            startup_timeout=setup.stack.startup_timeout, hook_args=hook_args,
        )  # fmt: skip
        await asyncio.to_thread(ranks.__enter__)
        try:
            yield ranks, RanksSync(ranks)
        finally:
            await asyncio.to_thread(ranks.__exit__, None, None, None)
        return
    from slimeish.trainer.trainer import Trainer
    from slimeish.trainer.weight_sync import WeightSync

    trainer = await asyncio.to_thread(Trainer, setup.trainer, setup.loss, hook_args)
    with WeightSync(config) as sync:
        yield trainer, sync


async def unload_adapter(sync: SyncHandle, name: str) -> None:
    """Unload a finished LoRA run's adapter; a failure is only logged: the run itself is done and saved."""
    try:
        await asyncio.to_thread(sync.unload_adapter)
    except Exception as e:  # any failure (HTTP, Ray) leaves only an adapter loaded
        log.warning("LoRA adapter %r is still loaded on the engines (%r); unload it with POST "
                    "/unload_lora_adapter {\"lora_name\": %r}", name, e, name)  # fmt: skip


def async_window(setup: TrainSetup) -> int:
    """Async mode's most groups generated but not yet trained. By default twice the groups one
    staleness window trains: with heavy-tailed episodes, 1x leaves about half the episode slots
    idle behind slow members (docs/benchmarks.md)."""
    staleness = setup.buffer.max_staleness or 0
    return setup.run.async_groups or 2 * (staleness + 1) * setup.rollout.rollout_batch_size


def train_source(setup: TrainSetup, args: argparse.Namespace) -> DataSource:
    state_path = setup.run.run_dir / "data_state.json"
    if setup.slime_hooks.data_source_path:  # slime's data source class, built as slime builds it
        source = load_data_source_class(setup.slime_hooks.data_source_path)(args)
        return PluginDataSource(source, setup.rollout.n_samples_per_prompt, state_path=state_path)
    assert setup.data.prompt_data is not None, "checked before the run starts"
    return DataSource(
        read_prompts(setup.data.prompt_data, setup.data),
        setup.rollout.n_samples_per_prompt,
        shuffle=setup.data.shuffle,
        seed=setup.data.shuffle_seed,
        state_path=state_path,
    )


def eval_source(setup: TrainSetup) -> DataSource | None:
    if setup.data.eval_prompt_data is None:
        return None
    prompts = read_prompts(setup.data.eval_prompt_data, setup.data)
    return DataSource(prompts, setup.rollout.n_samples_per_eval_prompt, shuffle=False)


def sync_config(run: RunConfig, stack: RunningStack, *, lora_name: str) -> WeightSyncConfig:
    """`lora_name`: a LoRA run's adapter name, the one its routers' --lora-path asks for."""
    from slimeish.trainer.weight_sync import WeightSyncConfig

    # The export dir is absolute: engines started elsewhere resolve paths from their own cwd.
    disk_dir = (run.run_dir / "weights").resolve()
    if run.weight_sync == "distributed":  # NCCL groups are per engine: the router cannot fan them out
        return WeightSyncConfig(engine_urls=stack.engine_urls, method="distributed", disk_dir=disk_dir)
    return WeightSyncConfig(  # the first router updates each engine once; the others record it
        post_write_path=run.custom_update_weight_post_write_path,
        router_url=stack.router_url,
        record_router_urls=stack.router_urls[1:],
        admin_token=stack.admin_token,
        method=run.weight_sync,
        disk_dir=disk_dir,
        lora_name=lora_name,
    )
