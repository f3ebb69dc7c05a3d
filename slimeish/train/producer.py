"""Rollout production: call the rollout function, land its groups in the buffer, feed regenerations.

The stale members of a group the buffer reopened go back to the data source, which serves them
as a partial group under the same `group_index`, so the new episodes join the same buffer group.

The rollout function is slime's synchronous `generate_rollout(args, rollout_id, data_source)`; it
runs in a worker thread so the trainer's event loop stays free. Groups it captured through router
sessions are already in the buffer. Samples it produced some other way (a slime plugin calling an
engine directly) are written to the buffer here, into the session it left open for them or a new
one per sample, so the trainer always reads whole groups from one place.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from slimeish.buffer import Buffer, ConflictError, SessionInfo, Turn
from slimeish.common.sample import Sample, Status, teacher_metadata
from slimeish.data import DataSource
from slimeish.rollout import (
    RECORD_FROM_RETURN,
    ROLLOUT_SIGNATURE,
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    session_metadata,
    training_group_id,
)
from slimeish.rollout.episode_metrics import merged
from slimeish.rollout.router_sessions import RouterSessions, SessionRef
from slimeish.rollout.run_state import rollout_run

log = logging.getLogger("slimeish.producer")


def sample_to_turns(
    session_id: str, sample: Sample, first_turn: int = 0, segment: int = 0, *, loss_type: str = "policy_loss"
) -> list[Turn]:
    """Exact turns of an uncaptured sample: each run of mask-1 tokens is one turn's output, and
    the tokens before it (the prompt, or given tokens such as tool results) its prompt. The turns
    are numbered from `first_turn`, in segment `segment` (a session's later samples start new ones).
    Under `sft_loss` a sample may lack `rollout_log_probs` (slime's SFT rollout sets none): the
    buffer keeps one per token, so 0.0 stands in; the SFT loss never reads them."""
    sample.validate()
    log_probs = sample.rollout_log_probs
    if log_probs is None and loss_type != "sft_loss":
        raise ValueError(
            f"sample {sample.group_index}/{sample.index} has no rollout_log_probs to train on: the policy loss "
            "needs the engine's log-prob of each response token (--loss-type sft_loss trains without them)"
        )
    if log_probs is None:
        log_probs = [0.0] * sample.response_length
    mask = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
    versions = [int(v) for v in sample.weight_versions] or [0]  # SGLang reports them as strings
    turns: list[Turn] = []
    prompt, pos = list(sample.tokens[: sample.prompt_length]), 0
    response = sample.tokens[sample.prompt_length :]
    for sampled, run in itertools.groupby(mask):
        end = pos + len(list(run))
        if sampled:
            logprobs = list(log_probs[pos:end])
            split = "returned_sample" if segment and not turns else None
            index = first_turn + len(turns)
            turns.append(Turn(session_id, index, segment, split, prompt, list(response[pos:end]), logprobs, versions))
            prompt = []
        else:
            prompt += response[pos:end]
        pos = end
    return turns


async def store_uncaptured(
    buffer: Buffer, groups: list[list[Sample]], args: Any, sessions: Callable[[], RouterSessions]
) -> None:
    """Record the returned samples no router session captured: into the session the rollout
    function left open for them (`RECORD_FROM_RETURN`; several samples of one member share it),
    then finished through `sessions()`, or into a new one where they had none (a rollout function
    that never opened sessions). A group may be partial: the regenerated members of a reopened group."""
    left_open: dict[SessionRef, list[Sample]] = {}
    for sample in (s for group in groups for s in group):
        if router := sample.metadata.pop(RECORD_FROM_RETURN, None):
            assert sample.session_id is not None, "a sample left to record names its open session"
            left_open.setdefault(SessionRef(sample.session_id, router), []).append(sample)
        elif not sample.session_id:
            try:
                await _store_direct(buffer, sample, args)
            except ConflictError:
                if sample.status != Status.FAILED:
                    raise
                # Failed because its place was taken when it opened its session (a regeneration a
                # restarted router queued got there first): that session fills the place.
                log.warning("not recording failed sample %s: its group place is held", sample.index)
    for session, member in left_open.items():
        await record_returned(buffer, args, sessions(), session, member)


async def record_returned(
    buffer: Buffer, args: Any, sessions: RouterSessions, session: SessionRef, member: list[Sample]
) -> None:
    """Append a member's returned samples to its open, empty router session, one segment each,
    then finish the session on its router (which seals it from the stored turns)."""
    n_turns = 0
    for segment, sample in enumerate(member):
        for turn in sample_to_turns(session.session_id, sample, n_turns, segment, loss_type=_loss_type(args)):
            await buffer.append_turn(turn)
            n_turns += 1
    lead = member[0]  # the rollout function gave the member's samples one status and reward
    status = Status.COMPLETED if lead.status == Status.PENDING else lead.status
    await sessions.finish(session, lead.reward, status, teacher_metadata(member))


def _loss_type(args: Any) -> str:
    return str(getattr(args, "loss_type", "policy_loss"))


async def _store_direct(buffer: Buffer, sample: Sample, args: Any) -> None:
    session_id = f"direct-{uuid.uuid4().hex}"
    group_size = args.n_samples_per_prompt
    info = SessionInfo(
        session_id, training_group_id(sample), sample.index or 0, group_size, session_metadata(sample, False)
    )
    await buffer.open_session(info)
    for turn in sample_to_turns(session_id, sample, loss_type=_loss_type(args)):
        await buffer.append_turn(turn)
    status = Status.COMPLETED if sample.status == Status.PENDING else sample.status
    reward = None if status == Status.FAILED else sample.reward
    await buffer.finish_session(session_id, reward, status.value, teacher_metadata([sample]))


def train_output(out: object) -> RolloutFnTrainOutput:
    """What a rollout function returned for training: `RolloutFnTrainOutput`, or as slime also
    allows a bare list of groups (`list[list[Sample]]`)."""
    if isinstance(out, RolloutFnTrainOutput):
        return out
    if isinstance(out, list) and all(isinstance(g, list) and all(isinstance(s, Sample) for s in g) for g in out):
        return RolloutFnTrainOutput(samples=out)
    raise TypeError(
        f"the rollout function returned {type(out).__name__}; expected RolloutFnTrainOutput or a list of "
        f"groups (list[list[Sample]]): {ROLLOUT_SIGNATURE}"
    )


def eval_output(out: object) -> RolloutFnEvalOutput:
    """What a rollout function returned for evaluation: `RolloutFnEvalOutput`, or as slime also
    allows a bare dict of datasets (`{name: {"rewards": [...], ...}}`)."""
    if isinstance(out, RolloutFnEvalOutput):
        return out
    if isinstance(out, dict) and all(isinstance(d, dict) and isinstance(d.get("rewards"), list) for d in out.values()):
        return RolloutFnEvalOutput(data=out)
    raise TypeError(
        f"the rollout function returned {type(out).__name__} for evaluation; expected RolloutFnEvalOutput or "
        f'a dict of datasets ({{name: {{"rewards": [...]}}}}): {ROLLOUT_SIGNATURE}'
    )


class RolloutProducer:
    """Runs the rollout function. Sync mode: `run_once()` per training step. Async mode:
    `start(max_groups)` streams groups one at a time from as many workers, keeping at most
    `max_groups` generated but not yet taken by the trainer, so a slow episode holds back only
    its own group, never a whole batch; the trainer frees slots with `release(n)` for groups it
    took, dropped or reopened (a reopened group's regeneration is a rollout call of its own)."""

    def __init__(self, rollout_fn: Callable[..., Any], args: Any, data: DataSource, buffer: Buffer):
        self.rollout_fn = rollout_fn
        self.args = args
        self.data = data
        self.buffer = buffer
        self.rollout_id = 0
        self._call_metrics: list[dict[str, float]] = []  # of the rollout calls since `take_metrics`
        self._tasks: list[asyncio.Task] = []
        self._slots: asyncio.Semaphore | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._error: BaseException | None = None
        self._sessions: RouterSessions | None = None  # made on first use: most runs never need it

    def _router_sessions(self) -> RouterSessions:
        """The one client that finishes the sessions rollout calls left open for the producer."""
        if self._sessions is None:
            args = self.args
            routers = getattr(args, "router_urls", None) or [args.router_url]
            stopping = rollout_run(args).stopping
            client = httpx.AsyncClient(timeout=60)
            self._sessions = RouterSessions(
                routers, args.admin_token, client, retry_s=args.router_retry_s, stopping=stopping
            )
        return self._sessions

    async def run_once(self, n_groups: int | None = None) -> None:
        """One rollout call for `n_groups` groups (default: a batch): regenerations first."""
        args = self.args
        if n_groups is not None and n_groups != args.rollout_batch_size:
            args = argparse.Namespace(**{**vars(args), "rollout_batch_size": n_groups})
        for request in await self.buffer.pop_regenerate(args.rollout_batch_size):
            meta = dict(request.metadata)
            prompt, label, group_index = (meta.pop(key, None) for key in ("prompt", "label", "group_index"))
            meta.pop("eval", None)
            if group_index is None:  # opened outside slimeish train (POST /sessions by hand): no prompt to draw
                log.warning("group %s cannot be regenerated: its sessions carry no group_index", request.group_id)
                continue
            self.data.regenerate(group_index, request.indices, prompt, label, meta)
        rollout_id, self.rollout_id = self.rollout_id, self.rollout_id + 1
        loop = asyncio.get_running_loop()
        out = train_output(await loop.run_in_executor(self._executor, self.rollout_fn, args, rollout_id, self.data))
        await store_uncaptured(self.buffer, out.samples, args, self._router_sessions)
        self._call_metrics.append(out.metrics)

    def take_metrics(self) -> dict[str, float]:
        """`episodes/`: the rollout calls that finished since the last take, merged into one step's."""
        calls, self._call_metrics = self._call_metrics, []
        return {f"episodes/{k}": v for k, v in merged(calls).items()}

    def start(self, max_groups: int) -> None:
        self._slots = asyncio.Semaphore(max_groups)
        # One thread per worker: each rollout call runs its own event loop in its thread.
        self._executor = ThreadPoolExecutor(max_workers=max_groups, thread_name_prefix="rollout")
        self._tasks = [asyncio.create_task(self._worker(self._slots)) for _ in range(max_groups)]

    async def _worker(self, slots: asyncio.Semaphore) -> None:
        # A failing episode is data (its session is finished as failed); a failing rollout call
        # is a bug or an outage, so it stops the run instead of being retried forever.
        while self._error is None:
            await slots.acquire()
            try:
                await self.run_once(1)
            except Exception as exc:
                log.exception("the rollout function failed")
                self._error = exc

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the rollout function failed: {self._error!r}") from self._error

    def release(self, n: int) -> None:
        """The trainer took `n` groups: let as many new ones start."""
        if self._slots is not None:
            for _ in range(n):
                self._slots.release()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._executor is not None:
            # Rollout calls in flight finish on their own; the run's processes stop right after.
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._sessions is not None:
            await self._sessions.client.aclose()
