"""The scripted stand-in engine (tests/scripted_engine.py) on its own, fast: it reads the tools and tool
results the tiny model's template renders, writes calls the router's parser reads back, and answers
SGLang's /generate plain and streamed with the same ids and log-probs."""

from __future__ import annotations

import json

import httpx
import orjson

from slimeish.router.renderers.template import ChatRenderer
from slimeish.router.tool_parser import parse_tool_calls
from tests.scripted_engine import ScriptedEngine, ShellScript, Tool, code_mode_arguments, read_prompt, side_reply
from tests.stand_in import serve_app

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Runs a command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            "required": ["command", "description"],
        },
    },
}
TASK = [{"role": "user", "content": "Create hello.txt"}]


def test_a_shell_call_from_the_rendered_schema_then_the_answer(tiny_model):
    renderer, policy = ChatRenderer(tiny_model), ShellScript("Bash", ["echo hi > hello.txt"])
    first = read_prompt(renderer.decode(renderer.full_ids(TASK, [BASH]), skip_special_tokens=False), 0)
    assert first.tools["Bash"].parameters == BASH["function"]["parameters"] and first.tool_results == []
    parsed = parse_tool_calls(policy.reply(first))
    arguments = json.loads(parsed.tool_calls[0]["function"]["arguments"])
    assert parsed.tool_calls[0]["function"]["name"] == "Bash"
    assert arguments == {"command": "echo hi > hello.txt", "description": "Runs echo hi > hello.txt"}
    call = {"role": "assistant", "content": "", "tool_calls": parsed.tool_calls}
    result = {"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": "done"}
    ids = renderer.full_ids([*TASK, call, result], [BASH])
    after = read_prompt(renderer.decode(ids, skip_special_tokens=False), 1)
    assert after.tool_results == ["done"] and policy.reply(after) == "Done."


def test_codex_code_mode_calls_its_declared_shell():
    declared = (
        "declare const tools: { exec_command(args: {\n  // Shell command.\n  cmd: string;\n  tty?: boolean;\n}): P"
    )
    schema = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
    arguments = code_mode_arguments(Tool("functions__exec", declared, schema), "echo hi")
    assert arguments == {
        "input": 'const result = await tools.exec_command({"cmd": "echo hi"});\ntext(JSON.stringify(result));'
    }


def test_a_side_call_asking_for_json_gets_the_schema_s_fields():
    schema = {"type": "OBJECT", "properties": {"score": {"type": "INTEGER"}}, "required": ["score"]}
    text = f"Answer in JSON:\n```json\n{json.dumps(schema)}\n```"
    assert json.loads(side_reply(read_prompt(text, 0))) == {"score": 10}
    assert side_reply(read_prompt("Write a title.", 0)) == "Create hello.txt"


def test_generate_plain_and_streamed_answer_the_same_ids_and_log_probs(tiny_model):
    engine = ScriptedEngine(tiny_model, policy=ShellScript("Bash", []))
    ids = ChatRenderer(tiny_model).full_ids(TASK, None)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 64}, "return_logprob": True}
    with serve_app(engine.app()) as url:
        plain = httpx.post(url + "/generate", json=body).json()
        streamed = httpx.post(url + "/generate", json=body | {"stream": True}).text
        assert httpx.get(url + "/model_info").json()["weight_version"] == "0"
    chunks = [
        orjson.loads(line[5:]) for line in streamed.splitlines() if line.startswith("data:") and "[DONE]" not in line
    ]
    assert plain["output_ids"][-1] == engine.tokenizer.eos_token_id and plain["text"] == "Create hello.txt"
    last = chunks[-1]["meta_info"] | {"id": plain["meta_info"]["id"]}  # each call has its own id
    assert chunks[-1]["output_ids"] == plain["output_ids"] and last == plain["meta_info"]
    assert len(chunks) == len(plain["output_ids"])
    logprobs = [lp for lp, _, _ in plain["meta_info"]["output_token_logprobs"]]
    assert len(set(logprobs)) == len(logprobs) and all(-16 < lp < 0 for lp in logprobs)
    assert [q for q, _ in engine.calls] == [body, body | {"stream": True}]
