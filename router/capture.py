"""Exact token capture for one session: segments, incremental rendering, and split reasons.

A segment is one token sequence the engine saw grow turn by turn. Each turn either extends a
segment (reusing its exact tokens, sampled ones included, and rendering only the new tail) or
starts a new segment whose `split_reason` says why. Planning a turn never mutates state, so a
turn that fails (bad input, engine error) leaves the session record unchanged; `commit` applies
a finished generation.

What the engine sees of the earlier replies on a chat turn (`--next-turn-prompt`): `sampled`
continues from their sampled tokens (the renderer's bridge); `template` renders the whole
conversation with the chat template, as a server without the router would (Qwen3's drops the
reasoning of replies before the last user query), and the turn extends the segment only where
that rendering does, else starts one (`template_rendered`).

Lineages: the agent a chat turn comes from is its system prompt and tools. Each agent's segments
are a line of their own (`Segment.lineage`, numbered in order of appearance), so a sub-agent
interleaved with the main conversation continues its own segment, and the main one its own,
instead of starting a segment at every switch. Only the latest segment of a lineage grows.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from slimeish.router import history as H
from slimeish.router.jsontypes import JSONObject
from slimeish.router.renderers.base import Renderer, TemplateError

Validator = Callable[[list[JSONObject], int], None]
# (the canonical system message or None, the tools): whose conversation a chat turn is
Agent = tuple[H.Canonical | None, list[JSONObject] | None]

SAMPLED, TEMPLATE = "sampled", "template"  # --next-turn-prompt
NEXT_TURN_PROMPT = "next_turn_prompt"  # the sample metadata key that records which one a session used


@dataclass
class ChatState:
    """A chat segment's conversation so far, which the next turn must extend."""

    history: list[JSONObject]  # the messages the agent sent last turn, as sent
    reply: JSONObject  # the assistant message the router returned for them
    tools: list[JSONObject] | None
    # `history` with each echoed reply replaced by the one the router returned (reasoning
    # included): what the `template` next-turn prompt renders.
    conversation: list[JSONObject]


@dataclass
class Segment:
    index: int
    split_reason: str | None
    tokens: list[int] = field(default_factory=list)
    version: int = 0  # bumped on every commit; detects two turns racing on one segment
    output_len: int = 0  # the last turn's sampled ids: the tail of `tokens` a renderer continues after
    chat: ChatState | None = None  # kept only while the segment is a chat conversation
    lineage: int = 0
    # Completions state: the prompt text plus the completion text returned for it.
    text: str | None = None


@dataclass
class TurnPlan:
    segment_index: int  # an existing segment, or len(segments) for a new one
    base_version: int | None  # the extended segment's version when planned; None for a new one
    split_reason: str | None
    prompt_ids: list[int]  # tokens appended before generation (the whole prompt for a new segment)
    input_ids: list[int]  # everything the engine is given
    messages: list[JSONObject] | None = None
    tools: list[JSONObject] | None = None
    prompt_text: str | None = None
    bridged: bool = False  # the prompt continues the segment's sampled tokens (counted once committed)
    conversation: list[JSONObject] | None = None  # `template` prompts: the messages rendered, if not `messages`
    agent: Agent | None = None  # chat turns: the agent the messages come from (its lineage, once committed)

    def with_forced(self, ids: list[int]) -> TurnPlan:
        """This plan with `ids` appended to its prompt: the start of the reply that `tool_choice`
        forces. They were not sampled, so the turn records them as prompt (loss mask 0)."""
        return replace(self, prompt_ids=self.prompt_ids + ids, input_ids=self.input_ids + ids)


@dataclass
class Committed:
    segment_index: int
    split_reason: str | None
    prompt_ids: list[int]
    new_segment: bool
    lineage: int


class Capture:
    def __init__(self, renderer: Renderer, next_turn_prompt: str = SAMPLED):
        self.renderer = renderer
        self.next_turn_prompt = next_turn_prompt
        self.segments: list[Segment] = []
        self.agents: list[Agent] = []  # lineage i is agents[i]

    def snapshot(self) -> list[Segment]:
        """The segments as they are, for `restore` (commit replaces a segment's fields, never mutates them)."""
        return [copy.copy(seg) for seg in self.segments]

    def restore(self, saved: list[Segment]) -> None:
        """Back to a `snapshot`: a turn that was not stored is taken out again."""
        self.segments = saved

    def clear(self) -> None:
        """Drop the tokens and history of a finished session: nothing extends it any more."""
        self.segments, self.agents = [], []

    # -- planning ---------------------------------------------------------------------------
    def plan_chat(self, messages: list[JSONObject], tools: list[JSONObject] | None, validate: Validator) -> TurnPlan:
        """`validate(messages, start)` is called before messages from `start` on are read: the
        ones before it equal messages validated in an earlier turn."""
        agent = _agent(messages, tools)
        for seg in reversed(self.segments):
            plan = self._try_extend_chat(seg, messages, tools, validate)
            if plan is not None:
                return self._only_latest(replace(plan, agent=agent))
        validate(messages, 0)
        reason = self._chat_split_reason(messages, tools, agent)
        render = self.renderer.template_ids if self.next_turn_prompt == TEMPLATE else self.renderer.full_ids
        return self._new(reason, render(messages, tools), messages=messages, tools=tools, agent=agent)

    def _try_extend_chat(
        self, seg: Segment, messages: list[JSONObject], tools: list[JSONObject] | None, validate: Validator
    ) -> TurnPlan | None:
        chat = seg.chat
        if chat is None or tools != chat.tools:
            return None
        k = len(chat.history)
        # Earlier messages come back exactly as the agent sent them last turn (a C-level list
        # compare); only the echoed reply is compared in canonical form.
        if len(messages) <= k + 1 or messages[:k] != chat.history:
            return None
        validate(messages, k)
        if H.canonical(messages[k]) != H.canonical(chat.reply) or not H.reasoning_kept(messages[k], chat.reply):
            return None
        if self.next_turn_prompt == TEMPLATE:
            return self._template_turn(seg, [*chat.conversation, chat.reply, *messages[k + 1 :]], messages, tools)
        try:
            tail = self.renderer.continuation(seg.tokens, seg.output_len, chat.reply, messages[k + 1 :], tools)
        except TemplateError:
            ids = self.renderer.full_ids(messages, tools)
            return self._new(H.TEMPLATE_UNSTABLE, ids, messages=messages, tools=tools)
        return TurnPlan(
            seg.index, seg.version, None, tail, seg.tokens + tail, messages=messages, tools=tools, bridged=True
        )

    def _template_turn(
        self, seg: Segment, conversation: list[JSONObject], messages: list[JSONObject], tools: list[JSONObject] | None
    ) -> TurnPlan:
        """The template's rendering of the whole conversation: it extends the segment only if it
        starts with the segment's tokens, else it starts one."""
        ids = self.renderer.template_ids(conversation, tools)
        n = len(seg.tokens)
        if len(ids) > n and ids[:n] == seg.tokens:
            return TurnPlan(seg.index, seg.version, None, ids[n:], ids, messages, tools, conversation=conversation)
        return self._new(H.TEMPLATE_RENDERED, ids, messages=messages, tools=tools, conversation=conversation)

    def _chat_split_reason(
        self, messages: list[JSONObject], tools: list[JSONObject] | None, agent: Agent
    ) -> str | None:
        """Why the turn does not extend the last conversation of its agent (or, for a new agent,
        the session's last conversation)."""
        lineage = self.agents.index(agent) if agent in self.agents else None
        chats = [s.chat for s in reversed(self.segments) if s.chat is not None]
        mine = [s.chat for s in reversed(self.segments) if s.chat is not None and s.lineage == lineage]
        last = next(iter(mine or chats), None)
        if last is None:
            return H.NEW_CONVERSATION if self.segments else None
        new = [H.canonical(m) for m in messages]
        if tools != last.tools:
            return self._handed_on(new) or H.TOOLS_CHANGED
        reason = H.split_reason([H.canonical(m) for m in last.history], H.canonical(last.reply), new)
        if reason == H.NEW_CONVERSATION:
            return self._handed_on(new) or reason
        return reason or H.ASSISTANT_EDITED  # extends only after canonicalisation, which the fast path refused

    def _handed_on(self, new: list[H.Canonical]) -> str | None:
        """Whether a new conversation continues one of the session's agents (`history.handed_on`):
        compared with the latest conversation of each lineage."""
        latest = {s.lineage: s.chat for s in self.segments if s.chat is not None}
        conversations = [[*map(H.canonical, c.history), H.canonical(c.reply)] for c in latest.values()]
        return H.handed_on(new, conversations)

    def plan_tokens(self, input_ids: list[int]) -> TurnPlan:
        for seg in reversed(self.segments):
            n = len(seg.tokens)
            if len(input_ids) > n and input_ids[:n] == seg.tokens:
                return self._only_latest(TurnPlan(seg.index, seg.version, None, input_ids[n:], list(input_ids)))
        return self._new(H.TOKENS_DIVERGED if self.segments else None, list(input_ids))

    def plan_text(self, prompt: str) -> TurnPlan:
        for seg in reversed(self.segments):
            if seg.text is not None and len(prompt) > len(seg.text) and prompt.startswith(seg.text):
                tail = self.renderer.encode(prompt[len(seg.text) :])
                plan = TurnPlan(seg.index, seg.version, None, tail, seg.tokens + tail, prompt_text=prompt)
                return self._only_latest(plan)
        reason = H.TOKENS_DIVERGED if self.segments else None
        return self._new(reason, self.renderer.encode(prompt), prompt_text=prompt)

    def _only_latest(self, plan: TurnPlan) -> TurnPlan:
        """Only the latest segment of a lineage grows; extending an earlier one (picking choice 0
        of n) starts a new segment whose prompt is that segment's exact tokens plus the tail."""
        if (
            plan.base_version is None
            or self._latest_of(self.segments[plan.segment_index].lineage) == plan.segment_index
        ):
            return plan
        return self.fork(plan, H.RESUMED_SEGMENT)

    def _latest_of(self, lineage: int) -> int:
        return next(s.index for s in reversed(self.segments) if s.lineage == lineage)

    def _new(self, reason: str | None, ids: list[int], **state: Any) -> TurnPlan:
        return TurnPlan(len(self.segments), None, reason, ids, ids, **state)

    # -- committing -------------------------------------------------------------------------
    def commit(
        self, plan: TurnPlan, output_ids: list[int], reply: JSONObject | None = None, text: str | None = None
    ) -> Committed:
        """Apply one finished generation; `reply` (chat) or `text` (completions) is what the
        agent was given, so the next turn can be recognised as extending this one."""
        seg, prompt_ids, reason = self._target(plan)
        seg.tokens = plan.input_ids + output_ids
        seg.version += 1
        seg.output_len = len(output_ids)
        if reply is not None and plan.messages is not None:
            conversation = plan.conversation if plan.conversation is not None else plan.messages
            seg.chat = ChatState(plan.messages, reply, plan.tools, conversation)
        else:
            seg.chat = None
        seg.text = plan.prompt_text + text if plan.prompt_text is not None and text is not None else None
        new_segment = plan.base_version is None or reason is not None
        return Committed(seg.index, reason, prompt_ids, new_segment, seg.lineage)

    def fork(self, plan: TurnPlan, reason: str) -> TurnPlan:
        """The same prompt as a new segment (also choices after the first of an n > 1 request)."""
        return replace(
            plan, segment_index=len(self.segments), base_version=None, split_reason=reason, prompt_ids=plan.input_ids
        )

    def _target(self, plan: TurnPlan) -> tuple[Segment, list[int], str | None]:
        """The planned segment if nothing touched it since planning and it is still the latest of
        its lineage; otherwise a new segment (another turn of this session committed in between)."""
        if plan.base_version is not None:
            planned = self.segments[plan.segment_index]
            if planned.version == plan.base_version and self._latest_of(planned.lineage) == planned.index:
                return planned, plan.prompt_ids, None
        reason = plan.split_reason if plan.base_version is None else H.CONCURRENT_TURN
        seg = Segment(index=len(self.segments), split_reason=reason, lineage=self._lineage(plan))
        self.segments.append(seg)
        return seg, plan.input_ids, reason

    def _lineage(self, plan: TurnPlan) -> int:
        """The lineage of a new segment: its agent's (numbered when first seen); token-in and
        completions turns stay on the lineage of what they extend, or the first."""
        if plan.agent is None:
            return self.segments[plan.segment_index].lineage if plan.segment_index < len(self.segments) else 0
        if plan.agent not in self.agents:
            self.agents.append(plan.agent)
        return self.agents.index(plan.agent)


def _agent(messages: list[JSONObject], tools: list[JSONObject] | None) -> Agent:
    first = messages[0] if messages and messages[0].get("role") in ("system", "developer") else None
    return (H.canonical(first) if first is not None else None, tools)
