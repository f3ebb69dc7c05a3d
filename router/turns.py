"""One captured turn: send a plan's `input_ids` to an engine, then commit and record the result.

Shared by the three generation paths (chat, completions, token-in /generate). The engine is
asked for log-probs of the sampled tokens; its `output_ids` and log-probs are recorded as given,
never re-derived from text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from slimeish.buffer import SessionFinishedError, Turn
from slimeish.common.finish import finish_type
from slimeish.common.routed_experts import new_token_rows
from slimeish.router.capture import TurnPlan
from slimeish.router.engine_api import GenerateReply, GenerateRequest, MetaInfo, SamplingParams
from slimeish.router.engine_pool import EnginePool
from slimeish.router.history import PARALLEL_CHOICE
from slimeish.router.jsontypes import JSONObject
from slimeish.router.metrics import RouterMetrics
from slimeish.router.sessions import Session
from slimeish.router.storage import STORE_ERRORS, StoreUnavailable, TurnStore

log = logging.getLogger(__name__)


# What a choice returned to the agent: the assistant message (chat dialects), the completion
# text (completions), or None (token-in: the engine's reply itself).
Answer = JSONObject | str | None


@dataclass
class Generation:
    """One sampled continuation as the engine returned it."""

    output_ids: list[int]
    logprobs: list[float]
    text: str
    finish_type: str  # SGLang's finish_reason.type: "stop" | "length" | "abort"
    weight_versions: list[int]
    engine: str
    raw: GenerateReply  # the engine's reply as it came, which token-in /generate answers verbatim
    matched_stop: str | None = None  # the stop string that ended it, if one did
    top_logprobs: list[list[list[Any]] | None] | None = None  # SGLang's output_top_logprobs, when asked
    routed_experts: str | None = None  # SGLang's meta_info.routed_experts (MoE), when asked
    forwarded: int = 0  # tokens the engine ran a forward on: its input and output but the last
    # set when the reply is parsed for the agent (`pipeline.assistant_message`), recorded with the turn
    parse_failure: str | None = None  # "malformed" | "truncated": its tool-call markup did not parse
    tool_calls: int = 0  # calls parsed from it


def _weight_versions(meta: MetaInfo) -> list[int]:
    spans = meta.get("weight_versions") or []
    versions = [int(s["version"]) for s in spans] if spans else [int(meta.get("weight_version") or 0)]
    return sorted(set(versions))


def _matched_stop(meta: MetaInfo) -> str | None:
    """SGLang's `finish_reason.matched`: a stop string, or a stop token's id (not a stop sequence)."""
    matched = (meta.get("finish_reason") or {}).get("matched")
    return matched if isinstance(matched, str) else None


def parse_generation(item: GenerateReply, engine: str) -> Generation:
    meta: MetaInfo = item.get("meta_info", {})
    entries = meta.get("output_token_logprobs") or []
    ids = list(item.get("output_ids") or [e[1] for e in entries])
    if [e[1] for e in entries] != ids:
        raise RuntimeError(f"engine {engine} returned log-probs that do not match its output_ids")
    return Generation(
        output_ids=ids,
        logprobs=[float(e[0]) for e in entries],
        text=item.get("text", ""),
        finish_type=finish_type(meta) or "length",  # no finish_reason: counted as cut off, never as a clean stop
        weight_versions=_weight_versions(meta),
        engine=engine,
        raw=item,
        matched_stop=_matched_stop(meta),
        top_logprobs=meta.get("output_top_logprobs"),
        routed_experts=meta.get("routed_experts"),
        forwarded=int(meta.get("prompt_tokens") or 0) + len(ids) - 1,
    )


class TurnRunner:
    def __init__(
        self,
        pool: EnginePool,
        store: TurnStore,
        metrics: RouterMetrics,
        *,
        routed_experts: bool = False,
        lora_path: str | None = None,
    ):
        self.pool, self.store, self.metrics = pool, store, metrics
        # every engine request asks for the experts of each token (MoE routing replay)
        self.routed_experts = routed_experts
        # a LoRA run samples with the trainer's adapter, never the bare base; a session opened with
        # its own `lora_path` (another policy sharing the engines) samples with that one
        self.lora_path = lora_path

    async def generate(
        self, session: Session | None, input_ids: list[int], sampling: SamplingParams, extra: JSONObject
    ) -> list[Generation]:
        """Generate `sampling["n"]` continuations on one engine (the session's, if healthy)."""
        payload = self._request(session, input_ids, sampling, extra)
        sticky = session.ledger.engine if session else None
        data, engine = await self.pool.generate(payload, sticky)
        if session is not None and session.ledger.engine != engine.url:
            if session.ledger.engine is not None:
                self.metrics.engine_failovers.inc()
            self._move(session, engine.url)
        items = data if isinstance(data, list) else [data]
        return [parse_generation(item, engine.url) for item in items]

    async def stream(
        self, session: Session | None, input_ids: list[int], sampling: SamplingParams, extra: JSONObject
    ) -> AsyncIterator[tuple[GenerateReply, str]]:
        """Like `generate`, streamed: (SGLang chunk, engine URL) pairs."""
        payload = self._request(session, input_ids, sampling, extra)
        sticky = session.ledger.engine if session else None
        async for chunk, engine in self.pool.stream(payload, sticky):
            if session is not None and session.ledger.engine != engine.url:
                if session.ledger.engine is not None:
                    self.metrics.engine_failovers.inc()
                self._move(session, engine.url)
            yield chunk, engine.url

    def _request(
        self, session: Session | None, input_ids: list[int], sampling: SamplingParams, extra: JSONObject
    ) -> dict[str, object]:
        """The /generate body: `extra` holds fields beyond the router's own (chat's
        `top_logprobs_num`; the token-in client's other SGLang fields, passed on as sent)."""
        request: GenerateRequest = {"input_ids": input_ids, "sampling_params": sampling, "return_logprob": True}
        if self.routed_experts:
            request["return_routed_experts"] = True
        if (lora_path := (session and session.identity.lora_path) or self.lora_path) is not None:
            request["lora_path"] = lora_path
        # the router's own fields win: a token-in body's `lora_path: null` or `return_logprob: false`
        # must not make the stored turn another policy's sample, or one without its log-probs
        return {**extra, **request}

    def _move(self, session: Session, url: str) -> None:
        if session.finished is not None:  # finished while generating: it no longer counts anywhere
            return
        self.pool.move(session.ledger.engine, url)
        session.ledger.engine = url

    async def record(
        self,
        session: Session,
        plan: TurnPlan,
        gens: list[Generation],
        answers: Sequence[Answer],
        started: float,
    ) -> None:
        """Commit each choice's turn to the capture and write it to the store, in order.

        `answers[i]` is what choice i returned to the agent: the assistant message (chat), the
        completion text (completions) or None (token-in). The turn is all its choices or nothing:
        a refused write, or one that failed to reach the store, rolls the capture back to before
        the turn, so the client's retry extends the segment as this turn would have. A write that
        failed may still land (a stalled store answers late): the turn is then revoked in the
        store before anything else is written for the session (`confirm`), and `StoreUnavailable`
        is raised, so the client is told it failed and it is never stored."""
        async with session.ledger.write_lock:
            if session.finished is not None:  # the finish stopped waiting for this turn
                # The refusal the buffer itself would give: appending to a finished session.
                raise SessionFinishedError(
                    f"session {session.identity.session_id} was finished while this turn was generating; "
                    "it is not recorded"
                )
            await self.confirm_locked(session)
            saved = session.capture.snapshot()
            first = session.ledger.turns
            try:
                for i, (gen, answer) in enumerate(zip(gens, answers, strict=True)):
                    await self.store.append_turn(
                        self._commit(session, plan, i, gen, answer, started), session.ledger.epoch
                    )
                    session.ledger.turns += 1
            except (Exception, asyncio.CancelledError) as e:
                session.capture.restore(saved)
                stored, session.ledger.turns = session.ledger.turns - first, first
                if isinstance(e, asyncio.CancelledError):  # the client left mid-write, which may still land
                    session.ledger.revoke_from = first
                    raise
                if not isinstance(e, STORE_ERRORS):  # a refusal (BufferInputError: 400/409) or a bug (500)
                    if stored:  # earlier choices of this turn landed: take them back too
                        session.ledger.revoke_from = first
                    raise
                log.warning(
                    "storing a turn of %s failed (%s): it is revoked", session.identity.session_id, type(e).__name__
                )
                session.ledger.revoke_from = first
                raise StoreUnavailable("the turn", e) from e

    def _commit(
        self, session: Session, plan: TurnPlan, i: int, gen: Generation, answer: JSONObject | str | None, started: float
    ) -> Turn:
        """Commit choice `i` to the capture: the turn to store."""
        choice_plan = plan if i == 0 else session.capture.fork(plan, PARALLEL_CHOICE)
        committed = session.capture.commit(
            choice_plan,
            gen.output_ids,
            reply=answer if isinstance(answer, dict) else None,
            text=answer if isinstance(answer, str) else None,
        )
        if committed.new_segment:
            self.metrics.segments.labels(committed.split_reason or "first").inc()
        elif choice_plan.bridged:
            self.metrics.bridged_turns.inc()
        self.metrics.turns.inc()
        self.metrics.tokens_in.inc(len(committed.prompt_ids))
        self.metrics.tokens_out.inc(len(gen.output_ids))
        return Turn(
            session_id=session.identity.session_id,
            turn_index=session.ledger.turns,
            segment_index=committed.segment_index,
            split_reason=committed.split_reason,
            lineage=committed.lineage,
            prompt_ids=committed.prompt_ids,
            output_ids=gen.output_ids,
            output_logprobs=gen.logprobs,
            weight_versions=gen.weight_versions,
            engine=gen.engine,
            finish_reason=gen.finish_type,
            started_at=started,
            finished_at=time.time(),
            parse_failure=gen.parse_failure,
            tool_calls=gen.tool_calls,
            routed_experts=None
            if gen.routed_experts is None
            else new_token_rows(gen.routed_experts, gen.forwarded, len(committed.prompt_ids) + len(gen.output_ids)),
        )

    async def confirm(self, session: Session) -> None:
        """Revoke the session's failed turn in the store (`record`); StoreUnavailable while the
        store still cannot be reached."""
        if session.ledger.revoke_from is not None:
            async with session.ledger.write_lock:
                await self.confirm_locked(session)

    async def confirm_locked(self, session: Session) -> None:
        """`confirm`, with the session's write lock already held."""
        ledger = session.ledger
        if ledger.revoke_from is None:
            return
        try:
            await self.store.revoke_turns(session.identity.session_id, ledger.revoke_from, ledger.epoch + 1)
        except STORE_ERRORS as e:
            raise StoreUnavailable("the revocation of a failed turn", e) from e
        ledger.epoch, ledger.revoke_from = ledger.epoch + 1, None
