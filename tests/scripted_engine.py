"""A scripted stand-in for an SGLang server running a model that calls tools.

The tiny test models write noise, so an agent program driven by one never calls a tool. This server
stands in for SGLang serving a model that does: it speaks what the router needs of an engine
(`/generate` plain and streamed in SGLang's cumulative chunks, `output_token_logprobs`,
`weight_version` in `meta_info`; `/health`, `/model_info`, `/server_info` with the context length,
`/flush_cache`; `/pause_generation` and `/continue_generation`, which have nothing to pause here
(a reply is written whole at once); `/update_weights_from_disk`, as `slimeish train --weight-sync disk` calls it: the
checkpoint directory must exist, no weights are read, and the request's `weight_version` (else the
next one) is reported from then on), decodes each request's `input_ids` with the tiny model's own tokenizer, lets a
`Policy` choose the reply's text from that prompt, and answers the text encoded with the same
tokenizer plus the end token, with deterministic log-probs distinct per token and prompt (no model runs).
Every /generate is recorded as (request, reply), the shape of tests/router's recording proxy, so
`engine_calls` and `assert_exact_capture` read it as they read a real engine's.

The prompt is read, and calls written, in the ChatML/Hermes family's format (the tiny model's
default, slimeish/models/chat_template.jinja): tools listed as JSON lines in `<tools>`, calls as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, results in `<tool_response>`.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from transformers import AutoTokenizer, PreTrainedTokenizerBase

JSONSchema = dict[str, Any]

# The template's fixed lines around the tool list, and around each tool result
_TOOLS = re.compile(r"The functions are listed in <tools></tools>:\n<tools>\n(.*?)\n</tools>\n", re.S)
_RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_SYSTEM_END = "<|im_end|>\n"


@dataclass(frozen=True)
class Tool:
    """A tool as the prompt lists it."""

    name: str
    description: str
    parameters: JSONSchema


@dataclass(frozen=True)
class Prompt:
    """One /generate request as the policy reads it."""

    text: str  # the decoded input_ids, special tokens kept
    turn: int  # this call's index among all the engine's calls
    tools: dict[str, Tool]  # by name, as rendered in the system turn
    tool_results: list[str]  # each `<tool_response>` of the conversation, in order

    @property
    def conversation(self) -> str:
        """The prompt after its system turn (the tool list and the program's system prompt)."""
        return self.text.split(_SYSTEM_END, 1)[-1] if self.text.startswith("<|im_start|>system") else self.text


class Policy(Protocol):
    """What the stand-in model writes: the reply's text (the end token is appended)."""

    def reply(self, prompt: Prompt) -> str: ...


def read_prompt(text: str, turn: int) -> Prompt:
    tools: dict[str, Tool] = {}
    if listed := _TOOLS.search(text):
        for line in listed.group(1).splitlines():
            tool = json.loads(line)
            tool = tool.get("function", tool)
            tools[tool["name"]] = Tool(tool["name"], tool.get("description") or "", tool.get("parameters") or {})
    body = text[listed.end() :] if listed else text
    return Prompt(text, turn, tools, _RESULT.findall(body))


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the family's template renders one (`router.tool_parser` reads it back)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@dataclass
class ScriptedEngine:
    """The stand-in's state: the tokenizer and policy it answers with and every call it answered."""

    model: Path
    policy: Policy | None = None  # set by each test before its program runs
    context_length: int = 262144
    weight_version: int = 0
    calls: list[tuple[dict, dict]] = field(default_factory=list)  # (request, reply), as the proxy logs them

    def __post_init__(self) -> None:
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.model)

    def answer(self, request: dict) -> dict:
        """SGLang's reply to one /generate, chosen by the policy; recorded."""
        prompt = read_prompt(self.tokenizer.decode(request["input_ids"], skip_special_tokens=False), len(self.calls))
        assert self.policy is not None, "the scripted engine was called before a test set its policy"
        text = self.policy.reply(prompt)
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        limit = request["sampling_params"].get("max_new_tokens")
        finish: dict[str, Any] = {"type": "stop", "matched": ids[-1]}
        if limit is not None and len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        # distinct per token and per prompt, the same for the same prompt (as a greedy model's), in
        # (-16, 0) and exact in float32 as the buffer stores them (k / 2**20 with k under 2**24)
        base = zlib.crc32(orjson.dumps(request["input_ids"])) % 4096 * 4096
        logprobs = [[-(base + j + 1) / 2**20, t, None] for j, t in enumerate(ids)]
        reply = {
            "text": self.tokenizer.decode(ids, skip_special_tokens=True),
            "output_ids": ids,
            "meta_info": {
                "id": f"scripted-{prompt.turn}",
                "finish_reason": finish,
                "prompt_tokens": len(request["input_ids"]),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "weight_version": str(self.weight_version),
                "output_token_logprobs": logprobs if request.get("return_logprob") else [],
            },
        }
        self.calls.append((request, reply))
        return reply

    def summary(self, start: int = 0) -> str:
        """One line per call from `start`: the tools and tool results its prompt held and the reply,
        for a failing test's message."""
        lines = []
        for request, reply in self.calls[start:]:
            prompt = read_prompt(self.tokenizer.decode(request["input_ids"], skip_special_tokens=False), 0)
            lines.append(f"{sorted(prompt.tools)} results={len(prompt.tool_results)} -> {reply['text'][:200]!r}")
        return "\n".join(lines)

    def chunks(self, reply: dict) -> Iterator[dict]:
        """A streamed reply as SGLang sends it: one cumulative chunk per token, the last finished."""
        ids, meta = reply["output_ids"], reply["meta_info"]
        for n in range(1, len(ids) + 1):
            done = n == len(ids)
            yield {
                "text": reply["text"] if done else self.tokenizer.decode(ids[:n], skip_special_tokens=True),
                "output_ids": ids[:n],
                "meta_info": meta
                | {
                    "finish_reason": meta["finish_reason"] if done else None,
                    "completion_tokens": n,
                    "output_token_logprobs": meta["output_token_logprobs"][:n],
                },
            }

    def info(self) -> dict:
        name = str(self.model)
        version = str(self.weight_version)  # SGLang's schema: a string
        return {"model_path": name, "served_model_name": name, "tokenizer_path": name, "is_generation": True,
                "weight_version": version, "max_context_length": self.context_length}  # fmt: skip

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            body = orjson.loads(await request.body())
            reply = self.answer(body)
            if not body.get("stream"):
                return Response(orjson.dumps(reply), media_type="application/json")
            events = [b"data: " + orjson.dumps(c) + b"\n\n" for c in self.chunks(reply)] + [b"data: [DONE]\n\n"]
            return StreamingResponse(iter(events), media_type="text/event-stream")

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/model_info")
        @app.get("/server_info")
        async def model_info() -> dict:
            return self.info()

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> Response:
            body = orjson.loads(await request.body())
            if not Path(str(body.get("model_path"))).is_dir():
                error = {"success": False, "message": f"model_path {body.get('model_path')!r} is no directory"}
                return Response(orjson.dumps(error), status_code=400, media_type="application/json")
            requested = body.get("weight_version")
            self.weight_version = self.weight_version + 1 if requested is None else int(requested)
            version = str(self.weight_version)
            reply = {"success": True, "message": "updated", "weight_version": version}
            return Response(orjson.dumps(reply), media_type="application/json")

        @app.post("/pause_generation")
        @app.post("/continue_generation")
        async def pause_or_continue() -> dict:
            return {"success": True, "message": "nothing to pause: each reply is written whole"}

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> Response:
            return Response(status_code=200)

        return app


def shell_arguments(tool: Tool, command: str) -> dict[str, Any]:
    """Arguments for a shell tool running `command`, by its parameters' schema: the command under
    the one property named for it (`command`, `cmd`, ...; a list of strings as `bash -lc`'s argv where
    the schema asks for an array), and a short text for any other required string (a description)."""
    properties: dict[str, JSONSchema] = tool.parameters.get("properties", {})
    named = [name for name in properties if re.search("command|cmd", name, re.I)]
    if len(named) != 1:
        raise ValueError(f"{tool.name} has no single command argument among {sorted(properties)}")
    key = named[0]
    arguments: dict[str, Any] = {key: ["bash", "-lc", command] if properties[key].get("type") == "array" else command}
    for name in tool.parameters.get("required", []):
        if name not in arguments:
            if properties.get(name, {}).get("type") != "string":
                raise ValueError(f"{tool.name}'s required argument {name!r} is no string: {properties.get(name)}")
            arguments[name] = f"Runs {command}"
    return arguments


# A nested tool in a code-mode tool's description: `declare const tools: { NAME(args: { FIELDS }): ...`,
# each field on a line of its own as `NAME?: TYPE;`
_DECLARED = re.compile(r"declare const tools: \{ (\w+)\(args: \{\n(.*?)\n\}\)", re.S)
_FIELD = re.compile(r"^  (\w+)(\??): (.+);$", re.M)


def declared_tools(description: str) -> dict[str, Tool]:
    """The nested tools a code-mode tool (Codex's `exec`) declares in TypeScript, each as a tool with
    a JSON schema of its arguments' names and (string, array or other) types."""
    tools = {}
    for name, fields in _DECLARED.findall(description):
        found = _FIELD.findall(fields)
        types = {f: "array" if t.startswith("Array") else "string" if t == "string" else t for f, _, t in found}
        required = [f for f, optional, _ in found if not optional]
        properties = {f: {"type": t} for f, t in types.items()}
        tools[name] = Tool(name, "", {"type": "object", "properties": properties, "required": required})
    return tools


def code_mode_arguments(tool: Tool, command: str) -> dict[str, Any]:
    """Arguments for a code-mode tool (Codex CLI's `exec`: JavaScript that calls the nested tools it
    declares) running `command` through its one nested shell tool; the script's one required string
    argument holds the source."""
    shells = []
    for nested in declared_tools(tool.description).values():
        try:
            shells.append((nested.name, shell_arguments(nested, command)))
        except ValueError:
            continue
    if len(shells) != 1:
        raise ValueError(f"{tool.name} declares no single shell tool: {[name for name, _ in shells]}")
    (name, arguments), required = shells[0], tool.parameters.get("required", [])
    if len(required) != 1:
        raise ValueError(f"{tool.name} takes no single source argument: {required}")
    return {required[0]: f"const result = await tools.{name}({json.dumps(arguments)});\ntext(JSON.stringify(result));"}


_JSON_BLOCK = re.compile(r"```json\n(.*?)\n```", re.S)
# A value of each JSON-schema type (OpenAPI's upper-case names too, as Gemini's schemas have them)
_VALUES: dict[str, Any] = {"string": "A short task.", "integer": 10, "number": 10, "boolean": False, "array": []}


def side_reply(prompt: Prompt) -> str:
    """What the model answers a program's auxiliary call (a title, a classifier, a summary): where the
    prompt asks for JSON, an object with each required property of the first JSON schema it shows
    (Gemini CLI's complexity classifier), else `{}`; otherwise a short title."""
    if "json" not in prompt.text.lower():
        return "Create hello.txt"
    for block in _JSON_BLOCK.findall(prompt.text):
        try:
            schema = json.loads(block)
        except ValueError:
            continue
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            types = {name: str(p.get("type", "string")).lower() for name, p in schema["properties"].items()}
            return json.dumps({name: _VALUES.get(types[name], {}) for name in schema.get("required", types)})
    return "{}"


@dataclass
class ShellScript:
    """A model that runs `commands`, one a turn, through the program's own shell tool `tool` (its
    argument names read from the tool's schema in the prompt), then answers `answer`. A request whose
    tools lack `tool` is one of the program's auxiliary calls, answered by `side`."""

    tool: str
    commands: list[str]
    answer: str = "Done."
    arguments: Callable[[Tool, str], dict[str, Any]] = shell_arguments  # how the tool takes a command
    side: Callable[[Prompt], str] = side_reply

    def reply(self, prompt: Prompt) -> str:
        if self.tool not in prompt.tools:
            return self.side(prompt)
        if (step := len(prompt.tool_results)) < len(self.commands):
            return tool_call(self.tool, self.arguments(prompt.tools[self.tool], self.commands[step]))
        return self.answer
