"""`slimeish train`: start the parts, then generate → train → sync weights, in one loop.

Sync mode runs the three phases in turn. Async mode keeps episodes running while the trainer
trains: the producer streams groups, keeping at most `--async-groups` (default
`2 * (max_staleness + 1) * rollout_batch_size`) generated but not yet trained; weights update in
place (pause → flush → update → continue, no request aborted), and the buffer never hands out a
group with a member older than `--max-staleness` versions: it reopens the group, and those
members come back through the regeneration queue to be generated again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine
from typing import Any

from tqdm import tqdm

from slimeish.buffer import Group
from slimeish.common.redact import mask_process_logs
from slimeish.train.checkpoint import save
from slimeish.train.collect import collect_groups, evaluate
from slimeish.train.launch import RunningStack, Stack
from slimeish.train.metrics import batch_metrics, prefixed, timed
from slimeish.train.parts import Parts, started
from slimeish.train.setup import TrainSetup, check_plugins, jsonable, parse_args
from slimeish.trainer.config import TrainerConfig

log = logging.getLogger("slimeish.train")


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


def run(setup: TrainSetup) -> None:
    """Run a whole training run: check the plugins, start the stack (buffer, engines, router; or
    use the ones given by URL), train, and stop every process it started (also on Ctrl-C)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    mask_process_logs()  # session keys in the rollout side's errors (session URLs), and the last traceback
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress bar
    if setup.data.prompt_data is None and not setup.slime_hooks.data_source_path:
        raise ValueError("a run needs prompt data (--prompt-data, or a --data-source-path)")
    check_plugins(setup)  # before any process starts: a wrong plugin fails in a second
    setup.run.run_dir.mkdir(parents=True, exist_ok=True)
    run_id = setup.run.run_id or setup.run.run_dir.resolve().name
    (setup.run.run_dir / "config.json").write_text(json.dumps(jsonable(setup), indent=2))
    with launcher(setup, run_id) as stack:
        try:
            asyncio.run(supervised(train(setup, stack, run_id), stack))
        except KeyboardInterrupt:
            log.warning("interrupted: stopping every child process")


def launcher(setup: TrainSetup, run_id: str) -> contextlib.AbstractContextManager[RunningStack]:
    """The local launcher (children of this process), or the Ray one (`--launcher ray`)."""
    model, run_dir, sync = setup.trainer.model_path, setup.run.run_dir, setup.run.weight_sync
    routers = router_flags(setup.trainer)
    if setup.cluster.launcher == "ray":
        from slimeish.cluster.launch import RayStack  # Ray is an optional dependency

        return RayStack(
            setup.stack, setup.cluster, model_path=model, run_dir=run_dir, run_id=run_id, weight_sync=sync,
            router_flags=routers,
        )  # fmt: skip
    return Stack(setup.stack, model_path=model, run_dir=run_dir, run_id=run_id, weight_sync=sync, router_flags=routers)


def router_flags(trainer: TrainerConfig) -> list[str]:
    """What the trainer needs every router of the run to ask the engines: each token's experts (it
    replays them), and its LoRA adapter (it trains that, not the bare base model)."""
    out = ["--return-routed-experts"] if trainer.use_rollout_routing_replay else []
    if trainer.lora_rank:
        out.append(f"--lora-path={trainer.lora_name}")  # the name `slimeish train`'s weight sync loads it under
    return out


async def supervised(training: Coroutine[Any, Any, None], stack: RunningStack) -> None:
    """Run `training` until it ends, or until the stack gives up a part the run needs."""
    task = asyncio.create_task(training)
    while not task.done():
        await asyncio.wait({task}, timeout=1.0)
        if stack.fatal is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            stack.raise_if_failed()
    task.result()


async def train(setup: TrainSetup, stack: RunningStack, run_id: str) -> None:
    run, n_groups = setup.run, setup.rollout.rollout_batch_size
    async with started(setup, stack, run_id) as p:
        unacked: list[str] = []  # trained since the last checkpoint; acknowledged once it is saved
        progress = tqdm(range(p.start, run.num_rollout), initial=p.start, total=run.num_rollout, desc="rollout")
        for step in progress:
            metrics: dict[str, Any] = {}
            if run.eval_interval and (step == p.start or step % run.eval_interval == 0):
                metrics |= await evaluate(p.rollout_fn, p.args, p.eval_data, step, p.hooks)
            with timed(metrics, "time/rollout"):
                taken = await collect_groups(p.buffer, p.producer, n_groups, p.trainer.weight_version, run.mode)
            metrics |= {f"buffer/{name}": float(n) for name, n in taken.counters().items()}
            metrics |= await train_or_log(p, taken.groups, rollout_only=run.debug_rollout_only)
            metrics |= p.producer.take_metrics()
            step_s = sum(metrics.get(f"time/{phase}", 0.0) for phase in ("rollout", "train", "sync"))
            metrics["perf/sampled_tokens_per_s"] = metrics.get("rollout/sampled_tokens", 0.0) / step_s
            samples = [s for g in taken.groups for s in g.samples]
            metrics = p.hooks.log_rollout(step, p.args, samples, metrics, metrics["time/rollout"])
            unacked += p.ledger.record(step, taken.groups)
            # The line first: a kill before the save re-runs this step, and the resumed run drops
            # the lines of the steps it runs again, so no step's line is lost or doubled.
            progress.write(p.logger.log(step, metrics))
            if step + 1 == run.num_rollout or (run.save_interval and (step + 1) % run.save_interval == 0):
                await asyncio.to_thread(save, p.trainer, p.data, run.checkpoints, step + 1, unacked)
                await p.buffer.ack(unacked)  # a crash before the save re-delivers them
                unacked = []
        if run.eval_interval:
            final = await evaluate(p.rollout_fn, p.args, p.eval_data, run.num_rollout, p.hooks)
            progress.write(p.logger.log(run.num_rollout, final))


async def train_or_log(p: Parts, groups: list[Group], *, rollout_only: bool) -> dict[str, Any]:
    """A training step on `groups`, or under slime's --debug-rollout-only only their metrics: no
    training, no weight sync."""
    if rollout_only:
        return batch_metrics([s for g in groups for s in g.samples], p.trainer.weight_version)
    return await train_and_sync(p, groups)


async def train_and_sync(p: Parts, groups: list[Group]) -> dict[str, Any]:
    """One training step on `groups`, then the new weights to the engines; the step's metrics."""
    p.hooks.filter_samples(p.args, [g.samples for g in groups])
    samples = [s for g in groups for s in g.samples]
    metrics: dict[str, Any] = batch_metrics(samples, p.trainer.weight_version)
    with timed(metrics, "time/train"):
        metrics |= prefixed("train", await asyncio.to_thread(p.trainer.train_step, samples))
    with timed(metrics, "time/sync"):
        metrics |= prefixed("time/sync", await asyncio.to_thread(p.sync.sync, p.trainer))
    metrics |= await asyncio.to_thread(p.router_counters.delta)
    if p.dynamic_filter is not None:
        metrics |= p.dynamic_filter.metrics()
    return metrics
