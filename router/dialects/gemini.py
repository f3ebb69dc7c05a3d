"""Google's Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
`:countTokens`, and the same under `/v1/`, google-genai's default version): Gemini CLI and the
`google-genai` SDK.

The request becomes the chat conversation capture takes: `systemInstruction` a system message,
a `model` content's `functionCall` parts an assistant's `tool_calls` (its `thought` parts its
reasoning), each `functionResponse` a tool message answering the call of the previous `model`
content with its id (or, without one, its name), before the user's text of the same content.
`tools[].functionDeclarations` are the chat tools; Google's hosted tools (`googleSearch`,
`codeExecution`, `urlContext`, ...) run on Google's side, so they are left out of the prompt.
The reply's text, parsed calls and (with `thinkingConfig.includeThoughts`) reasoning become
`text`, `functionCall` and `thought` parts. Streams are SSE (what `alt=sse` asks for), each event
a `GenerateContentResponse`; field names are accepted in camelCase (the API's JSON) or snake_case.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from slimeish.router import openai_bodies as R
from slimeish.router.dialects.base import Endpoint, endpoint
from slimeish.router.dialects.incremental import convert
from slimeish.router.dialects.tools import JSONSchema, chat_tools, tool_choice
from slimeish.router.engine_api import EngineChunks
from slimeish.router.errors import APIError, from_validation_error
from slimeish.router.jsontypes import JSONObject
from slimeish.router.pipeline import Conversation, InFlight, PlannedTurn, assistant_message, parse, serve_turn
from slimeish.router.renderers.base import TemplateError
from slimeish.router.schemas import SamplingFields, ToolChoice, TopK
from slimeish.router.sessions import Session
from slimeish.router.state import RouterState
from slimeish.router.streaming import ReplyStream, StreamedTurn, sse
from slimeish.router.turns import Generation

PREFIXES = ("/v1beta/models/", "/v1/models/")  # Gemini CLI asks v1beta, google-genai v1


class _Google(BaseModel):
    # The API's JSON is lowerCamelCase; proto field names (snake_case) are accepted too, as Google does.
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, validate_by_alias=True)


class FunctionCall(_Google):
    model_config = ConfigDict(extra="allow")
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class FunctionResponse(_Google):
    model_config = ConfigDict(extra="allow")  # willContinue, scheduling: accepted, ignored
    name: str
    response: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class Part(_Google):
    model_config = ConfigDict(extra="allow")  # thoughtSignature, videoMetadata: accepted, ignored
    text: str | None = None
    thought: bool = False
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    inline_data: Any = None
    file_data: Any = None


class Content(_Google):
    role: Literal["user", "model", "function"] = "user"  # `function`: older clients' role of responses
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(_Google):
    model_config = ConfigDict(extra="allow")  # behavior, response: accepted, ignored
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # Google's OpenAPI subset (types in capitals)
    parameters_json_schema: dict[str, Any] | None = None


class GeminiTool(_Google):
    # Any other field is a tool Google hosts (googleSearch, codeExecution, ...): left out of the prompt.
    model_config = ConfigDict(extra="allow")
    function_declarations: list[FunctionDeclaration] = Field(default_factory=list)


class FunctionCallingConfig(_Google):
    mode: Literal["AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"] = "AUTO"
    allowed_function_names: list[str] | None = None


class ToolConfig(_Google):
    model_config = ConfigDict(extra="allow")  # retrievalConfig: accepted, ignored
    function_calling_config: FunctionCallingConfig | None = None


class ThinkingConfig(_Google):
    model_config = ConfigDict(extra="allow")  # thinkingBudget, thinkingLevel: the model reasons as it was trained
    include_thoughts: bool = False


class GenerationConfig(_Google):
    # responseMimeType, responseSchema, penalties, ...: accepted, ignored (decoding is not constrained here)
    model_config = ConfigDict(extra="allow")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    candidate_count: Literal[1] | None = None  # one candidate per turn: an episode is one trajectory
    seed: int | None = None
    thinking_config: ThinkingConfig | None = None


class CountTokensBody(_Google):
    model_config = ConfigDict(extra="ignore")  # safetySettings, cachedContent, labels: accepted, ignored
    contents: list[Any] = Field(default_factory=list)  # checked one by one (`_converted`): only those a turn adds
    system_instruction: Content | str | None = None
    tools: list[GeminiTool] | None = None
    tool_config: ToolConfig | None = None


class GenerateContentRequest(CountTokensBody):
    contents: list[Any] = Field(min_length=1)
    generation_config: GenerationConfig = Field(default_factory=lambda: GenerationConfig.model_validate({}))


class CountTokensRequest(_Google):
    contents: list[Any] | None = None
    generate_content_request: CountTokensBody | None = Field(
        None, validation_alias=AliasChoices("generateContentRequest", "generate_content_request")
    )


# -- the request as a conversation ----------------------------------------------------------------
def _system(req: CountTokensBody) -> list[JSONObject]:
    s = req.system_instruction
    text = s if isinstance(s, str) else "".join(p.text or "" for p in s.parts) if s else ""
    return [{"role": "system", "content": text}] if text else []


_CONTENT: TypeAdapter[Content] = TypeAdapter(Content)


def _content(raw: list[Any], i: int) -> Content:
    try:
        content = _CONTENT.validate_python(raw[i])
    except ValidationError as e:
        raise from_validation_error(e, f"contents.{i}") from None
    for j, part in enumerate(content.parts):
        if part.inline_data is not None or part.file_data is not None:
            raise APIError(400, f"contents.{i}.parts.{j}: only text and function parts are served (a text-only model)")
    return content


def chat_messages(req: CountTokensBody) -> list[JSONObject]:
    """The whole request as chat messages."""
    return [*_system(req), *_converted(req.contents, 0, frozenset())[0]]


def _call_id(call: FunctionCall, i: int, j: int) -> str:
    """The call's id, or one fixed by where it stands (Gemini's calls need none): every turn converts
    the same history to the same ids, which its responses then name."""
    return call.id or f"call_{i}_{j}"


def _converted(raw: list[Any], start: int, calls: frozenset[str]) -> tuple[list[JSONObject], frozenset[str]]:
    """Contents `start`.. validated and converted (a response finds its call in `raw` itself)."""
    out: list[JSONObject] = []
    for i in range(start, len(raw)):
        content = _content(raw, i)
        out += [_model(content, i)] if content.role == "model" else _user(content, raw, i)
    return out, frozenset()


def _model(content: Content, i: int) -> JSONObject:
    text, reasoning, tool_calls = "", "", []
    for j, p in enumerate(content.parts):
        if p.function_response is not None:
            raise APIError(400, f"contents.{i}.parts.{j}: a functionResponse belongs in a user content")
        if p.function_call is not None:
            f = p.function_call
            arguments = json.dumps(f.args, ensure_ascii=False)
            tool_calls.append(
                {"id": _call_id(f, i, j), "type": "function", "function": {"name": f.name, "arguments": arguments}}
            )
        elif p.text is not None and p.thought:
            reasoning += p.text
        elif p.text is not None:
            text += p.text
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _user(content: Content, raw: list[Any], i: int) -> list[JSONObject]:
    results: list[JSONObject] = []
    text = ""
    for j, p in enumerate(content.parts):
        if p.function_call is not None:
            raise APIError(400, f"contents.{i}.parts.{j}: a functionCall belongs in a model content")
        if p.function_response is not None:
            answered = _answered_call(raw, i, j, p.function_response, {r["tool_call_id"] for r in results})
            output = json.dumps(p.function_response.response, ensure_ascii=False)
            results.append({"role": "tool", "tool_call_id": answered, "content": output})
        elif p.text is not None:
            text += p.text
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _answered_call(raw: list[Any], i: int, j: int, response: FunctionResponse, taken: set[str]) -> str:
    """The id of the call in the model content before `i` that `response` answers: by id, else the
    first by name that no earlier response of this content (`taken`) answered."""
    previous = _content(raw, i - 1) if i > 0 else None
    calls = [
        (_call_id(p.function_call, i - 1, k), p.function_call.name)
        for k, p in enumerate(previous.parts if previous and previous.role == "model" else [])
        if p.function_call is not None
    ]
    for call_id, name in calls:
        if call_id == response.id or (response.id is None and name == response.name and call_id not in taken):
            return call_id
    raise APIError(
        400,
        f"contents.{i}.parts.{j}: functionResponse {response.name!r} answers no functionCall of the model content "
        "before it (matched by id, else by name)",
    )


_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}


def json_schema(schema: Any) -> Any:
    """Google's OpenAPI schema subset as JSON Schema: its type names are in capitals."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: json_schema(v) for k, v in schema.items()}
    if isinstance(t := schema.get("type"), str) and t in _TYPES:
        out["type"] = t.lower()
    return out


def _declarations(req: CountTokensBody) -> list[FunctionDeclaration]:
    return [d for tool in req.tools or [] for d in tool.function_declarations]


def _chat_tools(req: CountTokensBody) -> list[JSONObject] | None:
    def schema(d: FunctionDeclaration) -> JSONSchema | None:
        return d.parameters_json_schema or (json_schema(d.parameters) if d.parameters is not None else None)

    return chat_tools((d.name, d.description, schema(d)) for d in _declarations(req))


def _tool_choice(req: CountTokensBody) -> ToolChoice:
    """`ANY` is "required", or the one function it allows; `VALIDATED` decodes as `AUTO` here."""
    config = req.tool_config.function_calling_config if req.tool_config else None
    names = [d.name for d in _declarations(req)]
    if config is None or config.mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return None
    if config.mode == "NONE":
        return "none"
    allowed = config.allowed_function_names or []
    if len(allowed) == 1:
        return tool_choice(None, allowed[0], names)
    for name in allowed:  # several allowed: any call is forced, each name must be a tool
        tool_choice(None, name, names)
    return tool_choice("required", None, names, said="ANY")


def conversation(req: GenerateContentRequest, session: Session | None) -> Conversation:
    g = req.generation_config
    sampling = SamplingFields(
        n=1,
        max_tokens=g.max_output_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        stop=g.stop_sequences,
        seed=g.seed,
    )
    messages = [*_system(req), *convert(session, "gemini", req.contents, _converted)]
    return Conversation(messages, _chat_tools(req), sampling, g.max_output_tokens, _tool_choice(req))


# -- the reply as a GenerateContentResponse -------------------------------------------------------
def parts(reply: JSONObject, thoughts: bool, text: str | None = None) -> list[JSONObject]:
    """The reply's parts: its reasoning (when asked for), `text` (default: its content), its calls."""
    out: list[JSONObject] = []
    if thoughts and (reasoning := reply.get("reasoning_content")):
        out.append({"text": reasoning, "thought": True})
    if text := reply.get("content") if text is None else text:
        out.append({"text": text})
    for call in reply.get("tool_calls") or []:
        f = call["function"]
        out.append({"functionCall": {"id": call["id"], "name": f["name"], "args": json.loads(f["arguments"])}})
    return out


def finish_reason(gen: Generation) -> str:
    return "MAX_TOKENS" if gen.finish_type == "length" else "STOP"  # Gemini ends a call with STOP too


def usage_metadata(prompt_tokens: int, gen: Generation) -> JSONObject:
    out = len(gen.output_ids)
    return {"promptTokenCount": prompt_tokens, "candidatesTokenCount": out, "totalTokenCount": prompt_tokens + out}


@dataclass
class GeminiTurn:
    stream: bool
    conversation: Conversation
    thoughts: bool  # thinkingConfig.includeThoughts: the reply's reasoning is sent as `thought` parts
    head: JSONObject  # what every response repeats: modelVersion, responseId

    @property
    def engine_extra(self) -> JSONObject:
        return {}

    def _body(self, content_parts: list[JSONObject], end: tuple[Generation, int] | None = None) -> JSONObject:
        """A GenerateContentResponse; `end` (the generation, the prompt's length): the last one."""
        candidate: JSONObject = {"content": {"role": "model", "parts": content_parts}, "index": 0}
        if end is None:
            return {"candidates": [candidate], **self.head}
        gen, prompt_tokens = end
        usage = usage_metadata(prompt_tokens, gen)
        return {"candidates": [{**candidate, "finishReason": finish_reason(gen)}], "usageMetadata": usage, **self.head}

    def answer(
        self, state: RouterState, planned: PlannedTurn, gens: list[Generation], replies: list[JSONObject]
    ) -> JSONObject:
        return self._body(parts(replies[0], self.thoughts), (gens[0], len(planned.plan.input_ids)))

    async def events(
        self, state: RouterState, planned: PlannedTurn, chunks: EngineChunks, result: StreamedTurn
    ) -> AsyncIterator[bytes]:
        """Text (and thought) parts while the engine streams; the calls, finish reason and usage
        go to `result.closing`, sent once the turn is recorded."""
        renderer = state.renderer
        stops = planned.params.get("stop", [])
        replies = ReplyStream(
            1, planned.parse_tools, stops, planned.forced, renderer.reasoning_markers, renderer.call_marker
        )
        async for d in replies.deltas(chunks):
            sent = [{"text": d.reasoning, "thought": True}] if d.reasoning and self.thoughts else []
            sent += [{"text": d.text}] if d.text else []
            if sent:
                yield sse(self._body(sent))
        (done,) = replies.finish(lambda g: assistant_message(state, g, planned.parse_tools, planned.forced))
        last = parts(done.message, False, done.last)
        result.closing.append(sse(self._body(last, (done.generation, len(planned.plan.input_ids)))))
        result.generations.append(done.generation)
        result.answers.append(done.message)

    def keepalive(self) -> bytes:
        """An empty text part: the SDKs decode it (an SSE comment line breaks google-genai's parser)."""
        return sse(self._body([{"text": ""}]))

    def error_event(self, error: APIError) -> bytes:
        return sse(error.google_body())

    def recorded(self, body: JSONObject, answers: list[JSONObject]) -> None:
        """Nothing: a Gemini client sends its whole history each turn."""


@dataclass(frozen=True)
class Gemini:
    stream: bool  # :streamGenerateContent

    def turn(self, state: RouterState, session: Session | None, body: JSONObject) -> GeminiTurn:
        req = parse(GenerateContentRequest, body)
        thinking = req.generation_config.thinking_config
        head = {"modelVersion": state.model_name, "responseId": R.new_id("")}
        return GeminiTurn(self.stream, conversation(req, session), bool(thinking and thinking.include_thoughts), head)


async def count_tokens(request: Request, api_key: str | None = None) -> Response:
    return await serve_turn(request, api_key, _count_tokens)


async def _count_tokens(state: RouterState, turn: InFlight, body: JSONObject, started: float) -> Response:
    req: CountTokensRequest = parse(CountTokensRequest, body)
    whole = req.generate_content_request or CountTokensBody(contents=req.contents or [])
    try:
        ids = state.renderer.full_ids(chat_messages(whole), _chat_tools(whole))
    except TemplateError as e:
        raise APIError(400, str(e), param="contents") from None
    return R.json_response({"totalTokens": len(ids)})


_METHODS: dict[str, Endpoint] = {
    "generateContent": endpoint(Gemini(stream=False)),
    "streamGenerateContent": endpoint(Gemini(stream=True)),
    "countTokens": count_tokens,
}


def gemini_route(path: str) -> tuple[str, Endpoint] | None:
    """(endpoint label, handler) of a `/v1beta/models/{model}:{method}` path, None for any other.
    The model named in the path is not checked: the router serves one (as `model` elsewhere)."""
    prefix = next((p for p in PREFIXES if path.startswith(p)), None)
    if prefix is None:
        return None
    model, _, method = path[len(prefix) :].rpartition(":")
    handler = _METHODS.get(method)
    return (f"{prefix}{{model}}:{method}", handler) if model and handler else None
