"""The episode runner shared by rollout functions (the router client it uses is
`slimeish.rollout.router_sessions`, which `slimeish train` also finishes sessions with).

A rollout function turns prompt groups into episodes: for every sample it opens a router session
(group id, index, group size), lets something drive the episode through that session (token-in
generate, an in-process agent, an external command), scores it, and finishes the session with the
reward or a failure status. The router captures every turn into the buffer, so the returned
samples are for metrics: the trainer reads the captured ones from the buffer. A sample whose
session captured nothing (its plugin called the engine itself) is recorded from what it returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httpx

from slimeish.common.redact import redact, redact_json
from slimeish.common.sample import Sample, Status, teacher_metadata
from slimeish.rollout import (
    RECORD_FROM_RETURN,
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    carries_response,
    sampling_params,
    session_metadata,
    training_group_id,
)
from slimeish.rollout.rewards import load_post_process, post_process_group
from slimeish.rollout.router_sessions import RouterSessions, Session
from slimeish.rollout.run_state import RolloutRun, rollout_run

log = logging.getLogger(__name__)


class EpisodeLost(RuntimeError):
    """The worker running the episode's agent was lost to its infrastructure (a Ray worker or node
    died): not the agent's fault, and nothing to learn from. `run_groups` aborts its session (its
    group place is freed) and generates the member again in a new one."""


# Times one group member is run before an episode lost every time is failed as any other error:
# a node dying takes an episode once; an agent that kills its own worker each time is not retried forever.
EPISODE_ATTEMPTS = 3


def timeout_error(exc: TimeoutError, elapsed: float, limit: float) -> str:
    """A timed-out episode's error: --rollout-timeout, or a limit of the generate or reward function's own
    (an asyncio timeout inside it, an HTTP client's), with the seconds the episode had run."""
    if elapsed >= limit:
        return f"TimeoutError: the episode passed --rollout-timeout ({limit:g} s) after {elapsed:.1f} s"
    detail = f": {exc}" if str(exc) else ""
    return f"TimeoutError{detail}: a limit inside the generate or reward function fired after {elapsed:.1f} s"


# The sample metadata key under which `run_groups` counts a member's regenerations (`rollout_output` sums them).
REGENERATED = "episodes_regenerated"
# The sample metadata key of a JSON object an episode wants kept with its member's samples in the buffer (the
# finish metadata: the task, the patch, the grader's output of a harness episode), for the viewer and exports.
STORED_METADATA = "stored_metadata"


# An episode returns its group member: one sample, or several (slime's list-returning generate),
# which become the segments of the member's session and share its one reward.
EpisodeFn = Callable[[Session, Sample], Awaitable[Sample | list[Sample]]]

# The rollout call's router client, for episode code that runs inside `run_groups`.
_sessions: contextvars.ContextVar[RouterSessions] = contextvars.ContextVar("slimeish_rollout_sessions")


def router_sessions() -> RouterSessions:
    """The router client of the running rollout call (one per call: its HTTP client is closed when it ends)."""
    return _sessions.get()


def http_client() -> httpx.AsyncClient:
    """The HTTP client of the running rollout call, for an agent SDK to share."""
    return _sessions.get().client


def group_id_for(sample: Sample, evaluation: bool, rollout_id: int, run: RolloutRun) -> str:
    """Training groups are named by their group index; eval groups live in the run's own namespace."""
    return f"eval-{run.eval_nonce}-{rollout_id}-{sample.group_index}" if evaluation else training_group_id(sample)


async def run_groups(
    args: Any, groups: list[list[Sample]], episode: EpisodeFn, *, rollout_id: int, evaluation: bool
) -> list[list[Sample]]:
    """Run every sample of every group as one session, at most `args.rollout_concurrency` at once
    across all rollout calls of the run (`args.rollout_run`).

    An episode that raises, times out, or ends without a finite reward is finished as failed
    (the buffer's group policy decides about its group). One that raises `EpisodeLost` (its
    worker died) is not the agent's failure: its session is aborted, freeing its group place, and
    the member is generated again in a new session, up to `EPISODE_ATTEMPTS` runs in all. A
    training session that captured nothing while its sample carries tokens of its own (a slime
    plugin that called the router's root /generate) is left open, marked `RECORD_FROM_RETURN`:
    `slimeish train` records the returned tokens into it and finishes it
    (`slimeish.train.producer.record_returned`). Errors talking to the router are not the
    episode's fault: they are raised once every episode has ended."""
    run = rollout_run(args)
    limit = run.episode_slots(args.rollout_concurrency)
    limits = httpx.Limits(max_connections=args.rollout_concurrency)  # one connection per running episode
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.rollout_timeout + 30), limits=limits) as client:
        routers = getattr(args, "router_urls", None) or [args.router_url]  # a plugin's own args may name one
        sessions = RouterSessions(
            routers, args.admin_token, client, retry_s=args.router_retry_s, stopping=run.stopping,
            first=run.first_router(len(routers)),
        )  # fmt: skip
        _sessions.set(sessions)
        # The rollout's sampling, for the turns an agent sends without it (token-in sends it all itself).
        sampling = sampling_params(args, evaluation=evaluation)
        # Only a custom generate can have called the engine around the session (the root /generate);
        # every other episode's turns went through it, so it needs no look at what was captured.
        bypasses = bool(getattr(args, "custom_generate_function_path", None))
        hook_path = getattr(args, "custom_reward_post_process_path", None)
        post_process = load_post_process(hook_path) if hook_path else None

        async def open_place(sample: Sample, group_id: str, size: int, meta: dict) -> Session | None:
            """The member's session, or None (the sample failed) when its place is taken."""
            try:
                session = await sessions.open(
                    group_id, cast(int, sample.index), size, meta, trainable=not evaluation, sampling_defaults=sampling
                )
            except httpx.HTTPStatusError as e:
                if e.response.status_code != 409:
                    raise
                # The place is held: a regeneration queued by a restarted router took it first.
                _fail(sample, f"group {group_id} place {sample.index} is taken: {e.response.text[:200]}")
                return None
            sample.session_id = session.session_id
            return session

        async def one(sample: Sample, group_size: int) -> tuple[Session | None, list[Sample]]:
            async with limit:
                meta = session_metadata(sample, evaluation)
                group_id = group_id_for(sample, evaluation, rollout_id, run)
                if sample.index is None:
                    raise ValueError("a rollout sample needs the index its data source gave it (get_samples sets it)")
                for attempt in range(1, EPISODE_ATTEMPTS + 1):
                    if (session := await open_place(sample, group_id, group_size, meta)) is None:
                        return None, [sample]
                    started = time.monotonic()
                    try:
                        out = await asyncio.wait_for(episode(session, sample), timeout=args.rollout_timeout)
                        return session, _member(out if isinstance(out, list) else [out], session.session_id)
                    except TimeoutError as exc:  # the message says which limit fired, and when
                        _fail(sample, timeout_error(exc, time.monotonic() - started, args.rollout_timeout))
                        return session, [sample]
                    except EpisodeLost as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        if attempt == EPISODE_ATTEMPTS:  # lost every time: failed as any error is
                            _fail(sample, f"{error} (lost {attempt} times)")
                            return session, [sample]
                        if not await sessions.abort(session):  # a restarted router's recovery regenerates it
                            _fail(sample, f"{error}; its session was closed by a router restart")
                            return None, [sample]
                        log.warning("group %s place %d: episode lost (%s); generating it again (attempt %d of %d)",
                                    group_id, sample.index, error, attempt + 1, EPISODE_ATTEMPTS)  # fmt: skip
                        sample.metadata[REGENERATED] = attempt
                    except Exception as exc:  # the agent's failure is data: the group policy decides
                        _fail(sample, f"{type(exc).__name__}: {exc}")
                        return session, [sample]
                raise AssertionError("the last attempt returns")

        async def finish(session: Session | None, member: list[Sample]) -> None:
            if session is None:  # it never had one
                return
            lead = member[0]  # `_member` gave every sample the member's status and reward
            reward = _finite(lead.reward)
            if lead.status != Status.FAILED and reward is None:
                _fail_all(member, f"no usable reward: {lead.reward!r}")
            failed = lead.status == Status.FAILED
            own_tokens = bypasses and all(carries_response(s) for s in member)
            if not (failed or evaluation) and own_tokens and not await sessions.captured_turns(session):
                for s in member:  # its own tokens: slimeish train records them and finishes it on this router
                    s.metadata[RECORD_FROM_RETURN] = session.router_url
                return
            # a failed member's error, or its teacher log-probs (slime's OPD post-process sets them), and its record
            metadata = {"error": lead.metadata["error"]} if failed else teacher_metadata(member)
            metadata |= redact_json(lead.metadata.get(STORED_METADATA, {}))  # a program's output may quote its URL
            if lead.scores and not failed:  # the named scores beside the reward (an environment's rubric parts)
                metadata["scores"] = dict(lead.scores)
            await sessions.finish(session, None if failed else reward, lead.status, metadata)

        async def one_group(group: list[Sample]) -> list[Sample]:
            # A training group may be partial (the stale members of a reopened group): its size is the run's.
            size = len(group) if evaluation else args.n_samples_per_prompt
            done = await asyncio.gather(*(one(s, size) for s in group), return_exceptions=True)
            ran = [d for d in done if not isinstance(d, BaseException)]
            if post_process is not None:  # slime's hook sees the group's finished members at once
                post_process_group(args, post_process, [s for _, m in ran for s in m if s.status != Status.FAILED])
            await asyncio.gather(*(finish(session, member) for session, member in ran))
            if errors := [d for d in done if isinstance(d, BaseException)]:
                raise errors[0]
            return [s for _, member in ran for s in member]

        results = await asyncio.gather(*(one_group(g) for g in groups), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return cast(list[list[Sample]], results)  # no exception among them: checked above


def _member(samples: list[Sample], session_id: str) -> list[Sample]:
    """The samples of one group member, in its session, sharing one outcome: failed if any failed,
    else one reward. A member is one buffer session, which holds one reward for all its segments,
    so differing rewards (slime trains each sample with its own) fail it, saying what to do."""
    for s in samples:
        s.session_id = session_id
    if failed := next((s for s in samples if s.status == Status.FAILED), None):
        _fail_all(samples, failed.metadata.get("error", "a sample of the member failed"))
    elif len({repr(s.reward) for s in samples}) > 1:
        rewards = [s.reward for s in samples]
        _fail_all(
            samples,
            f"the {len(samples)} samples a generate function returned for one group member have rewards {rewards}, "
            "but a member is trained with one reward (slimeish's buffer keeps one per member, where slime trains "
            "each sample with its own): give them the same reward (e.g. the episode's final one), or return each "
            "sample from a --rollout-function-path as its own group member (its own index, with "
            "--n-samples-per-prompt counting them) so that each keeps its reward",
        )
    return samples


def _fail_all(samples: list[Sample], error: str) -> None:
    for s in samples:
        _fail(s, error)


def _fail(sample: Sample, error: str) -> None:
    sample.status = Status.FAILED
    sample.metadata["error"] = redact(error)  # stored with the sample: an HTTP error may quote the session URL


def _finite(reward: object) -> float | None:
    """The reward as a float if the trainer can learn from it (a finite number), else None: a
    custom generate function may have set anything."""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return None
    return float(reward)


def checked_reward(value: object, source: str) -> float:
    """`value` as the reward a plugin returned; anything but a number fails the episode, naming
    the plugin (`source`) and what it must return."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{source} returned {value!r}; it must return the reward as a number (-> float); "
            "several named scores go in sample.scores"
        )
    return float(value)


def rollout_output(groups: list[list[Sample]], evaluation: bool) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Package finished groups with the metrics every rollout function reports."""
    samples = [s for g in groups for s in g]
    rewards = [s.reward for s in samples if s.status != Status.FAILED and s.reward is not None]
    metrics = {
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "failed": float(sum(s.status == Status.FAILED for s in samples)),
        "truncated": float(sum(s.status == Status.TRUNCATED for s in samples)),
        "episodes": float(len(samples)),
        "rewarded": float(len(rewards)),  # what reward_mean and reward_std are over
        # members generated again after their worker was lost (EpisodeLost): infrastructure, not the agent
        "regenerated": float(sum(s.metadata.get(REGENERATED, 0) for s in samples)),
    }
    if evaluation:
        truncated = [s.status == Status.TRUNCATED for s in samples]
        data: dict[str, dict[str, list[Any]]] = {"eval": {"rewards": rewards, "truncated": truncated}}
        return RolloutFnEvalOutput(data=data, metrics=metrics)
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def episode_groups(args: Any, data_source: Any, evaluation: bool) -> list[list[Sample]]:
    """The prompt groups of one rollout step (every eval prompt when evaluating)."""
    if evaluation:
        return data_source.get_samples(len(data_source.prompts))
    return data_source.get_samples(args.rollout_batch_size)


def run_episodes(
    args: Any,
    data_source: Any,
    episode: EpisodeFn,
    *,
    rollout_id: int,
    evaluation: bool,
    metrics: Callable[[list[list[Sample]]], dict[str, float]] | None = None,
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """A rollout function's whole step: draw the groups, run `episode` on each sample through its
    own router session, and package the result (the common ending of the built-in rollout functions),
    with the rollout function's own `metrics` of the finished groups added."""
    groups = episode_groups(args, data_source, evaluation)
    groups = asyncio.run(run_groups(args, groups, episode, rollout_id=rollout_id, evaluation=evaluation))
    out = rollout_output(groups, evaluation)
    if metrics is not None:
        out.metrics.update(metrics(groups))
    return out
