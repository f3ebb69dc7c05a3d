"""The tiny models load through the ordinary `from_pretrained` path and their template is complete."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slimeish.models.tiny import TinyModelConfig, build_tokenizer

REFERENCE_TOKENIZER = Path(__file__).parent / "data/claude-legacy-tokenizer/tokenizer.json"

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "what is 2+3?"}]},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "b", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 1}}},
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "5"},
    {"role": "tool", "tool_call_id": "b", "content": "2"},
    {"role": "assistant", "content": "It is 5."},
]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3"])
def test_files_and_loading(tiny_model_factory, arch):
    path = tiny_model_factory(arch)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).exists(), name
    assert "chat_template" in json.loads((path / "tokenizer_config.json").read_text())
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == arch
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok)
    logits = model(torch.tensor([tok.encode("hello world")])).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


def test_chat_template_roles_tools_and_calls(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '<tools>\n{"name": "add"' in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n<tool_call>' in text
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>" in text
    )
    assert text.endswith("<|im_start|>assistant\nIt is 5.<|im_end|>\n<|im_start|>assistant\n")


def test_special_tokens_are_single_ids(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert len(tok.encode(token)) == 1, token
    assert tok.eos_token == "<|im_end|>"
    # Markup tokens survive decoding with skip_special_tokens (the tool parser needs them).
    ids = tok.encode("<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


def test_template_is_prefix_stable(tiny_model):
    """Appending messages only appends text: the property the router's incremental capture uses."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for k in range(2, len(CONVERSATION)):
        prefix = tok.apply_chat_template(CONVERSATION[:k], tools=TOOLS, tokenize=False)
        full = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
        if CONVERSATION[k - 1]["role"] != "tool" or CONVERSATION[k]["role"] != "tool":
            assert full.startswith(prefix), k


def test_ensure_tiny_model_reuses_an_existing_model(tmp_path):
    from slimeish.models.tiny import ensure_tiny_model

    out = ensure_tiny_model(tmp_path / "m")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path / "m") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt


def _harness_system_prompt() -> str:
    """Claude Code's recorded system prompt and tool list: English prose, JSON schemas, code and
    shell in the tools' descriptions."""
    request = json.loads((Path(__file__).parent / "programs/requests/claude-code-2.1.332.json").read_text())
    return "\n".join(block["text"] for block in request["system"]) + "\n" + json.dumps(request["tools"], indent=2)


def test_realistic_tokenizer_counts_tokens_like_a_real_model():
    """Tokens per character within 1.3x of a real family's tokenizer (the legacy Claude tokenizer,
    see tests/data/claude-legacy-tokenizer), where the default synthetic one is over 2x."""
    from tokenizers import Tokenizer

    text = _harness_system_prompt()
    reference = len(Tokenizer.from_file(str(REFERENCE_TOKENIZER)).encode(text).ids)
    realistic = build_tokenizer(TinyModelConfig(tokenizer="realistic"))
    assert len(realistic) == 16384
    ratio = len(realistic.encode(text)) / reference
    assert 0.8 < ratio < 1.3, f"{len(realistic.encode(text))} tokens vs the reference's {reference}"
    assert len(build_tokenizer(TinyModelConfig()).encode(text)) > 2 * reference
