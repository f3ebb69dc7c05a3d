"""OpenAI Responses (`POST /v1/responses`): Codex, openai-agents' and pydantic-ai's default models.

Input items become the chat conversation capture takes: `instructions` a system message, message
items their role's message, an assistant message and the `function_call` items after it one
assistant message with `tool_calls`, each `function_call_output` a tool message. A reply's
reasoning (renderers that parse it: `reasoning_content`) is a `reasoning` item before its message
and calls, its text as `reasoning_text` content and `encrypted_content` the router's reference to
it (`slimeish.router.reasoning`); a `reasoning` item sent back starts the assistant message the
items after it complete, its text that message's reasoning (checked by capture: the sampled one, or
none, continues the segment). With `store` (the default) the session keeps each response's
conversation and body, so a client that sends only new items and `previous_response_id` continues
the same one, and `GET /v1/responses/{id}` returns it. The request's items and tools are read in
`responses_request`, the answer's output items and stream events built in `responses_output`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from slimeish.router import history as H
from slimeish.router import openai_bodies as R
from slimeish.router.dialects.base import endpoint
from slimeish.router.dialects.incremental import convert
from slimeish.router.dialects.responses_output import (
    CUSTOM_INPUT,
    CallShape,
    CallShapes,
    Events,
    finished,
    response_events,
)
from slimeish.router.dialects.responses_request import (
    HOSTED_TOOLS,
    CustomTool,
    CustomToolCallItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    NamedFunction,
    NamespaceTool,
    ReasoningItem,
    ResponsesRequest,
    flat_name,
    item_type,
    items,
    with_item_tools,
)
from slimeish.router.dialects.tools import chat_tools, joined_text, served_tools, tool_choice
from slimeish.router.engine_api import EngineChunks
from slimeish.router.errors import APIError
from slimeish.router.jsontypes import JSONObject
from slimeish.router.pipeline import (
    Conversation,
    PlannedTurn,
    parse,
)
from slimeish.router.schemas import SamplingFields, ToolChoice
from slimeish.router.sessions import Session, StoredResponse
from slimeish.router.state import RouterState
from slimeish.router.streaming import StreamedTurn
from slimeish.router.turns import Generation


def _served(body: JSONObject) -> JSONObject:
    return served_tools(with_item_tools(body), ("function", "custom", "namespace"), "a function tool", HOSTED_TOOLS)


def _functions(req: ResponsesRequest) -> list[tuple[str, FunctionTool | CustomTool]]:
    """Each tool under the name the model sees: a namespace's tools flattened."""
    out: list[tuple[str, FunctionTool | CustomTool]] = []
    for t in req.tools or []:
        if isinstance(t, NamespaceTool):
            out += [(flat_name(t.name, f.name), f) for f in t.tools]
        else:
            out.append((t.name, t))
    return out


def call_shapes(req: ResponsesRequest) -> CallShapes:
    """How calls to the request's namespaced and freeform tools are answered, by flattened name."""
    shapes = {
        flat_name(t.name, f.name): CallShape(f.name, t.name, isinstance(f, CustomTool))
        for t in req.tools or []
        if isinstance(t, NamespaceTool)
        for f in t.tools
    }
    return shapes | {t.name: CallShape(t.name, custom=True) for t in req.tools or [] if isinstance(t, CustomTool)}


def _chat_tools(req: ResponsesRequest) -> list[JSONObject] | None:
    return chat_tools((name, t.description, t.parameters) for name, t in _functions(req))


def _tool_choice(req: ResponsesRequest) -> ToolChoice:
    choice, names = req.tool_choice, [name for name, _ in _functions(req)]
    if isinstance(choice, NamedFunction):
        return tool_choice(None, choice.name, names)
    return tool_choice(choice, None, names)


def history(session: Session | None, req: ResponsesRequest) -> list[JSONObject]:
    """The conversation before this request's items: the stored response it continues, if any."""
    if req.previous_response_id is None:
        return []
    stored = session.memory.responses.get(req.previous_response_id) if session else None
    if stored is None:
        raise APIError(
            400,
            f"previous response {req.previous_response_id!r} is not a stored response of this session "
            "(responses created with store: false are not kept)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.conversation


def stored_response(session: Session | None, response_id: str) -> bytes:
    """The body of a response the session stored: 404 in OpenAI's shape for any other id."""
    stored = session.memory.responses.get(response_id) if session else None
    if stored is None:
        raise APIError(404, f"No response found with id {response_id!r} in this session.", param="response_id")
    return stored.body


def chat_messages(
    state: RouterState, session: Session | None, raw: str | list[Any], before: list[JSONObject]
) -> list[JSONObject]:
    """The input as chat messages after `before` (whose calls a function_call_output may answer)."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    session_id = session.identity.session_id if session else ""
    converter = partial(_converted, lambda ref, text: state.signer.verify(session_id, ref, text))
    if before:
        return converter(raw, 0, frozenset(c["id"] for m in before for c in m.get("tool_calls") or ()))[0]
    return convert(session, "responses", raw, converter, _resumable)


def _resumable(raw: list[Any], start: int) -> bool:
    """Whether the item at `start` opens a message of its own. A function_call right after an item
    of an assistant message (reasoning, an assistant message, a call), or an assistant message
    right after a reasoning item, completes that item's message: then convert all."""
    kind, before = item_type(raw[start]), item_type(raw[start - 1])
    if kind in ("function_call", "custom_tool_call"):
        return not (
            before in ("function_call", "custom_tool_call", "reasoning")
            or (before == "message" and _role(raw[start - 1]) == "assistant")
        )
    return not (kind == "message" and _role(raw[start]) == "assistant" and before == "reasoning")


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


def _reasoning_message(item: ReasoningItem, verified: Callable[[str, str], bool]) -> JSONObject:
    """The assistant message a reasoning item opens; a reference that is not the router's marks it
    as the agent's own reasoning (an edit)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if text := item.text():
        message["reasoning_content"] = text
    if item.encrypted_content is not None and not verified(item.encrypted_content, text):
        message[H.FOREIGN_REASONING] = True
    return message


def _opened_by_reasoning(out: list[JSONObject]) -> bool:
    return bool(out) and out[-1]["role"] == "assistant" and out[-1]["content"] is None and "tool_calls" not in out[-1]


def _converted(
    verified: Callable[[str, str], bool], raw: list[Any], start: int, open_calls: frozenset[str]
) -> tuple[list[JSONObject], frozenset[str]]:
    out: list[JSONObject] = []
    calls = set(open_calls)
    for i, item in enumerate(items(raw, start), start):
        if isinstance(item, ReasoningItem):
            out.append(_reasoning_message(item, verified))
        elif isinstance(item, MessageItem) and item.role == "assistant" and _opened_by_reasoning(out):
            out[-1] = {**out[-1], "content": joined_text(item.content)}
        elif isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": joined_text(item.content)})
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.tool_name(), "arguments": _args(item)},
            }
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": None})
            out[-1] = {**out[-1], "tool_calls": [*(out[-1].get("tool_calls") or []), call]}
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in calls:
                raise APIError(
                    400,
                    f"input.{i}: no function_call with call_id {item.call_id!r} before this output",
                    param=f"input.{i}",
                )
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": joined_text(item.output)})
        # additional_tools (served with `tools`) and configuration_update items add no message
    messages = [{**m, "content": m["content"] or None} if m["role"] == "assistant" else m for m in out]
    return messages, frozenset(calls)


def _args(item: FunctionCallItem | CustomToolCallItem) -> str:
    """A call's arguments as the model saw them: a freeform tool's input is its one string argument."""
    return item.arguments if isinstance(item, FunctionCallItem) else orjson.dumps({CUSTOM_INPUT: item.input}).decode()


def conversation(
    state: RouterState, req: ResponsesRequest, session: Session | None
) -> tuple[Conversation, list[JSONObject]]:
    """The conversation, and its messages without `instructions` (what `store` keeps)."""
    before = history(session, req)
    kept = [*before, *chat_messages(state, session, req.input, before)]
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    sampling = SamplingFields(n=1, max_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p)
    conv = Conversation([*system, *kept], _chat_tools(req), sampling, req.max_output_tokens, _tool_choice(req))
    return conv, kept


def _signer(state: RouterState, session: Session | None, response_id: str) -> Callable[[str], str]:
    """The `encrypted_content` of this response's reasoning: a reference the router recognises."""
    session_id = session.identity.session_id if session else ""
    return lambda text: state.signer.sign(session_id, response_id, text)


def response_shell(req: ResponsesRequest, model: str) -> JSONObject:
    """The response object before any output (what `response.created` carries)."""
    tool_choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedFunction) else req.tool_choice
    return {
        "id": R.new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "metadata": req.metadata or {},
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": tool_choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "store": req.store,
        "text": {"format": {"type": "text"}},
        "usage": None,
    }


@dataclass
class ResponsesTurn:
    req: ResponsesRequest
    conversation: Conversation
    session: Session | None
    kept: list[JSONObject]  # the conversation without `instructions`: what `store` keeps
    shell: JSONObject  # the response before any output (`response_shell`)
    sign: Callable[[str], str]
    shapes: CallShapes
    ev: Events = field(default_factory=Events)  # the stream's events, numbered

    @property
    def stream(self) -> bool:
        return self.req.stream

    @property
    def engine_extra(self) -> JSONObject:
        return {}

    def answer(
        self, state: RouterState, planned: PlannedTurn, gens: list[Generation], replies: list[JSONObject]
    ) -> JSONObject:
        return {**self.shell, **finished(gens[0], replies[0], len(planned.plan.input_ids), self.sign, self.shapes)}

    def events(
        self, state: RouterState, planned: PlannedTurn, chunks: EngineChunks, result: StreamedTurn
    ) -> AsyncIterator[bytes]:
        return response_events(state, chunks, planned, self.shell, result, self.ev, self.sign, self.shapes)

    def keepalive(self) -> bytes:
        return self.ev("response.in_progress", response=self.shell)

    def error_event(self, error: APIError) -> bytes:
        failure = {"code": error.code or error.type, "message": error.message}
        return self.ev("response.failed", response={**self.shell, "status": "failed", "error": failure})

    def recorded(self, body: JSONObject, answers: list[JSONObject]) -> None:
        """With `store`, the session keeps the response for `previous_response_id` and GET."""
        if self.session is not None and self.req.store:
            self.session.memory.responses[self.shell["id"]] = StoredResponse(
                [*self.kept, answers[0]], orjson.dumps(body)
            )


class Responses:
    def turn(self, state: RouterState, session: Session | None, body: JSONObject) -> ResponsesTurn:
        req = parse(ResponsesRequest, _served(body))
        conv, kept = conversation(state, req, session)
        shell = response_shell(req, req.model or state.model_name)
        sign = _signer(state, session, shell["id"])
        return ResponsesTurn(req, conv, session, kept, shell, sign, call_shapes(req))


responses = endpoint(Responses())
