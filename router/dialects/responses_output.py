"""A Responses turn's result as the API answers it: the response object's output items and usage,
and, streamed, the event sequence clients parse (`response.created` ... `response.completed`).
The request side, and the wiring through the capture pipeline, are in `responses`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any

import orjson

from slimeish.router import openai_bodies as R
from slimeish.router.engine_api import EngineChunks
from slimeish.router.jsontypes import JSONObject
from slimeish.router.pipeline import PlannedTurn, assistant_message
from slimeish.router.state import RouterState
from slimeish.router.streaming import ReplyStream, StreamedTurn
from slimeish.router.turns import Generation


@dataclass(frozen=True, slots=True)
class CallShape:
    """How a call the model made under a flattened tool name is answered: under the tool's own
    `name` in its `namespace`, and for a freeform (`custom`) tool as a `custom_tool_call` whose
    `input` is the one string argument the model saw (`CUSTOM_INPUT`)."""

    name: str
    namespace: str | None = None
    custom: bool = False


CallShapes = Mapping[str, CallShape]  # a tool name as the model sees it -> how its calls are answered
CUSTOM_INPUT = "input"  # the one argument of a freeform tool, as rendered to the model


def finished(
    gen: Generation, reply: JSONObject, prompt_tokens: int, sign: Callable[[str], str], shapes: CallShapes
) -> JSONObject:
    """What the response object gains when its turn is done: output, status, usage."""
    cut = gen.finish_type == "length"
    return {
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output_items(reply, sign, shapes),
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(gen.output_ids),
            "output_tokens_details": {"reasoning_tokens": 0},  # the reasoning's token count is not separated
            "total_tokens": prompt_tokens + len(gen.output_ids),
        },
    }


def output_items(reply: JSONObject, sign: Callable[[str], str], shapes: CallShapes) -> list[JSONObject]:
    # A reply without calls is always a message item (even empty), so the agent sends the turn back.
    calls = reply.get("tool_calls") or []
    reasoning = reply.get("reasoning_content")
    items = [_reasoning_item(reasoning, sign(reasoning), "completed")] if reasoning else []
    items += [_message_item(reply.get("content") or "", "completed")] if reply.get("content") or not calls else []
    return items + [_call_item(c, "completed", shapes) for c in calls]


def _reasoning_item(text: str | None, reference: str | None, status: str, item_id: str | None = None) -> JSONObject:
    """Reasoning as open-weight servers give it: the raw text as `reasoning_text` content, no summary."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    item_id = item_id or R.new_id("rs_")
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": content,
        "encrypted_content": reference,
        "status": status,
    }


def _message_item(text: str | None, status: str, item_id: str | None = None) -> JSONObject:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    item_id = item_id or R.new_id("msg_")
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call: JSONObject, status: str, shapes: CallShapes) -> JSONObject:
    """A call as a `function_call` item; a call to a namespace's function carries its own name and
    the `namespace`, as OpenAI returns it (and as the client sends it back); a call to a freeform
    tool is a `custom_tool_call` with its `input` string."""
    f = call["function"]
    shape = shapes.get(f["name"], CallShape(f["name"]))
    item = {"id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"], "name": shape.name}
    if shape.namespace is not None:
        item["namespace"] = shape.namespace
    if shape.custom:
        return {"type": "custom_tool_call", **item, "input": custom_input(f["arguments"]), "status": status}
    return {"type": "function_call", **item, "arguments": f["arguments"], "status": status}


def custom_input(arguments: str) -> str:
    """A freeform tool's input from the arguments the model sampled: its one string argument, else
    the arguments as sampled (a model that wrote the input bare)."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    value = parsed.get(CUSTOM_INPUT) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


class Events:
    """Responses stream events, numbered in order."""

    def __init__(self) -> None:
        self.numbers = count()

    def __call__(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": next(self.numbers), **data}
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


async def response_events(
    state: RouterState,
    chunks: EngineChunks,
    planned: PlannedTurn,
    shell: JSONObject,
    result: StreamedTurn,
    ev: Events,
    sign: Callable[[str], str],
    shapes: CallShapes,
) -> AsyncIterator[bytes]:
    """`response.created`, `.in_progress`, the reasoning item (once its end is sampled) and the
    message item's text deltas while the engine streams; the text's and calls' closing events and
    `response.completed` go to `result.closing`."""
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    stops, markers = planned.params.get("stop", []), state.renderer.reasoning_markers
    replies = ReplyStream(1, planned.parse_tools, stops, planned.forced, markers, state.renderer.call_marker)
    item_id, sent = "", ""
    output: list[JSONObject] = []
    async for d in replies.deltas(chunks):
        if d.reasoning:
            output.append(_reasoning_item(d.reasoning, sign(d.reasoning), "completed"))
            for event in _reasoning_events(ev, 0, output[0]):
                yield event
        if d.text and not item_id:
            item_id = R.new_id("msg_")
            for event in _text_opening(ev, len(output), item_id):
                yield event
        if d.text:
            sent += d.text
            yield _text_delta(ev, len(output), item_id, d.text)
    (done,) = replies.finish(lambda g: assistant_message(state, g, planned.parse_tools, planned.forced))
    closing = []
    if not item_id and (done.last or not done.message.get("tool_calls")):  # as output_items: a message
        item_id = R.new_id("msg_")
        closing += _text_opening(ev, len(output), item_id)
    if done.last:
        closing.append(_text_delta(ev, len(output), item_id, done.last))
    if item_id:
        output.append(_message_item(sent + done.last, "completed", item_id))
        closing += _text_closing(ev, len(output) - 1, output[-1])
    for call in done.message.get("tool_calls") or []:
        closing += _call_events(ev, len(output), _call_item(call, "completed", shapes))
        output.append(_call_item(call, "completed", shapes))
    prompt_tokens = len(planned.plan.input_ids)
    final = {**shell, **finished(done.generation, done.message, prompt_tokens, sign, shapes), "output": output}
    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
    closing.append(ev(kind, response=final))
    result.closing += closing
    result.generations.append(done.generation)
    result.answers.append(done.message)
    result.body = final


def _reasoning_events(ev: Events, index: int, item: JSONObject) -> list[bytes]:
    """A reasoning item whole: its text is sent in one delta, as it is known only once it closed."""
    text, at = item["content"][0]["text"], {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        ev(
            "response.output_item.added",
            output_index=index,
            item=_reasoning_item(None, None, "in_progress", item["id"]),
        ),
        ev("response.content_part.added", **at, part={"type": "reasoning_text", "text": ""}),
        ev("response.reasoning_text.delta", **at, delta=text),
        ev("response.reasoning_text.done", **at, text=text),
        ev("response.content_part.done", **at, part=item["content"][0]),
        ev("response.output_item.done", output_index=index, item=item),
    ]


def _text_opening(ev: Events, index: int, item_id: str) -> list[bytes]:
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [
        ev("response.output_item.added", output_index=index, item=_message_item(None, "in_progress", item_id)),
        ev("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part),
    ]


def _text_delta(ev: Events, index: int, item_id: str, text: str) -> bytes:
    at = {"item_id": item_id, "output_index": index, "content_index": 0}
    return ev("response.output_text.delta", **at, delta=text, logprobs=[])


def _text_closing(ev: Events, index: int, item: JSONObject) -> list[bytes]:
    part, at = item["content"][0], {"item_id": item["id"], "output_index": index}
    return [
        ev("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]),
        ev("response.content_part.done", **at, content_index=0, part=part),
        ev("response.output_item.done", output_index=index, item=item),
    ]


def _call_events(ev: Events, index: int, item: JSONObject) -> list[bytes]:
    at = {"item_id": item["id"], "output_index": index}
    # a function call streams its `arguments`, a custom tool call its `input`
    field, kind = (
        ("input", "custom_tool_call_input")
        if item["type"] == "custom_tool_call"
        else ("arguments", "function_call_arguments")
    )
    return [
        ev("response.output_item.added", output_index=index, item={**item, field: "", "status": "in_progress"}),
        ev(f"response.{kind}.delta", **at, delta=item[field]),
        ev(f"response.{kind}.done", **at, **{field: item[field]}),
        ev("response.output_item.done", output_index=index, item=item),
    ]
