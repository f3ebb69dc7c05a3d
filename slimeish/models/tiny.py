"""Build tiny causal LMs and tokenizers in Hugging Face format, offline.

No model hub is reachable from CI or the demo machine, so slimeish makes its own checkpoints:
a byte-level BPE tokenizer trained (with the `tokenizers` library) on a small synthetic corpus
(`--tokenizer realistic`: also on the Python standard library's sources and docs, for token counts
near a real model's on agent prompts),
the chat template and special tokens of a model family (`--family`: slimeish's ChatML/Hermes
template, Qwen3's own with reasoning, Qwen3-Coder's own with XML calls, GLM-4.5's own with
reasoning and <arg_key>/<arg_value> calls, Llama 3.2's own with JSON calls, DeepSeek-V3-0324's own
with calls in a section of special tokens), and a randomly
initialised Qwen2, Llama, Qwen3, Qwen3-MoE, GLM-4.5 or DeepSeek-V3 model from `transformers` (`--arch qwen3_moe`:
every layer sparse, `--num-experts` experts of width `--moe-intermediate-size`, `--experts-per-token`
routed per token, top-k weights renormalised as Qwen3-30B-A3B has them; `--arch glm4_moe`: GLM-4.5-Air's
shape: the first layer dense, then sigmoid routing with a score-correction bias, one shared expert,
routed weights renormalised and scaled by 2.5, half the head dims rotary, q/k/v biases; `--arch deepseek_v3`:
DeepSeek-V3's shape: multi-head latent attention with low-rank q and kv, the first layer dense, then
sigmoid routing with a score-correction bias within the best half of two expert groups, one shared
expert, routed weights renormalised and scaled by 2.5, plain RoPE). The result is a directory that
`from_pretrained` loads exactly like a real checkpoint, so every loader in slimeish is exercised
on the real code path.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slimeish.common.config import add_dataclass_args, from_namespace, help_field

Arch = Literal["qwen2", "llama", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3"]
MOE_ARCHS = ("qwen3_moe", "glm4_moe", "deepseek_v3")
Family = Literal["chatml", "qwen3", "qwen3-coder", "glm-4.5", "llama3", "deepseek-v3"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Markup tokens the template and tool parser rely on; like Qwen's, they are not "special",
# so decoding with skip_special_tokens keeps them.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


@dataclass(frozen=True)
class FamilyTokens:
    """A family's vocabulary of markup: special tokens (role markers), the end of a turn, and
    every id that ends generation (GLM ends a turn with the next role's marker)."""

    special: list[str]
    eos: str
    markup: list[str]
    stops: list[str]
    pad: str = "<|endoftext|>"
    bos: str | None = None  # written by the template where it has one (`bos_token`)


_QWEN = FamilyTokens(SPECIAL_TOKENS, "<|im_end|>", MARKUP_TOKENS, ["<|im_end|>"])
_GLM_ROLES = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
_GLM_ARGS = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
# DeepSeek writes its markers with a fullwidth bar (U+FF5C) and `▁` (U+2581) for spaces.
_DEEPSEEK_TURNS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
_DEEPSEEK_PARTS = "calls▁begin calls▁end call▁begin call▁end sep outputs▁begin outputs▁end output▁begin output▁end"
_DEEPSEEK_CALLS = [f"<｜tool▁{part}｜>" for part in _DEEPSEEK_PARTS.split()]
_LLAMA_TURNS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
TOKENS: dict[str, FamilyTokens] = {
    "chatml": _QWEN,
    "qwen3": _QWEN,
    "qwen3-coder": _QWEN,
    "glm-4.5": FamilyTokens(
        ["<|endoftext|>", *_GLM_ROLES],
        "<|endoftext|>",
        MARKUP_TOKENS + _GLM_ARGS,
        ["<|endoftext|>", "<|user|>", "<|observation|>"],
    ),
    "llama3": FamilyTokens(
        ["<|begin_of_text|>", "<|end_of_text|>", *_LLAMA_TURNS],
        "<|eot_id|>",
        [],
        ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
        pad="<|end_of_text|>",
        bos="<|begin_of_text|>",
    ),
    "deepseek-v3": FamilyTokens(
        _DEEPSEEK_TURNS,
        "<｜end▁of▁sentence｜>",
        _DEEPSEEK_CALLS,
        ["<｜end▁of▁sentence｜>"],
        pad="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
    ),
}
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
# Each family's chat template, and the architecture its checkpoints use unless --arch says otherwise.
TEMPLATES: dict[str, Path] = {
    "chatml": CHAT_TEMPLATE_PATH,
    "qwen3": Path(__file__).with_name("qwen3_chat_template.jinja"),
    "qwen3-coder": Path(__file__).with_name("qwen3_coder_chat_template.jinja"),
    "glm-4.5": Path(__file__).with_name("glm45_chat_template.jinja"),
    "llama3": Path(__file__).with_name("llama3_chat_template.jinja"),
    "deepseek-v3": Path(__file__).with_name("deepseek_v3_chat_template.jinja"),
}
FAMILY_ARCH: dict[str, Arch] = {
    "chatml": "qwen2",
    "qwen3": "qwen3",
    "qwen3-coder": "qwen3",
    "glm-4.5": "qwen3",
    "llama3": "llama",
    "deepseek-v3": "llama",
}

_WORDS = (
    "the a an of to and in is it you that for on are with as be this was have or at by not from "
    "what all can will one there about which when your up out so if them some more time would "
    "number answer add sum plus minus times result tool call function arguments name value weather "
    "city temperature search query file read write list user assistant system please help yes no "
    "true false null calculator compute echo reverse word letter count first last "
).split()


@dataclass(kw_only=True)
class TinyModelConfig:
    family: Family = help_field("chatml", help="chat format: its template and special tokens (the router's renderer)")
    arch: Arch | None = help_field(None, help="architecture (Hugging Face classes; default: the family's)")
    tokenizer: Literal["synthetic", "realistic"] = help_field(
        "synthetic",
        help="BPE training text: synthetic (toy words, chat markup and tools: short vocabulary, fast tests) or "
        "realistic (also the Python standard library's sources and language reference: token counts on agent "
        "prompts near a real model's)",
    )
    vocab_size: int | None = help_field(
        None, help="BPE vocabulary size, special tokens included (default: 1024 synthetic, 16384 realistic)"
    )
    hidden_size: int = help_field(64, help="model width")
    intermediate_size: int = help_field(176, help="MLP width")
    num_layers: int = help_field(2, help="transformer layers")
    num_heads: int = help_field(4, help="attention heads")
    num_kv_heads: int = help_field(2, help="key/value heads (GQA when fewer than --num-heads)")
    max_position_embeddings: int = help_field(4096, help="context length")
    rope_theta: float = help_field(10000.0, help="RoPE base")
    tie_word_embeddings: bool | None = help_field(None, help="tie input/output embeddings (default: per family)")
    num_experts: int = help_field(4, help="MoE archs: routed experts per sparse layer")
    experts_per_token: int = help_field(2, help="MoE archs: experts each token is routed to (num_experts_per_tok)")
    moe_intermediate_size: int = help_field(32, help="MoE archs: each expert's MLP width")
    seed: int = help_field(0, help="seed for the corpus and the weights")


def _synthetic_corpus(seed: int, family: str, n_lines: int = 4000) -> list[str]:
    """Text like what the model will see: words, digits, JSON, chat markup, tool lists and calls.

    Rendered tool lists (the chat template's system turn with JSON-schema tools) are part of it,
    so BPE merges their recurring pieces: a prompt with four tools is ~4x fewer tokens than with
    a tokenizer that never saw them, which matters for every forward pass on a CPU."""
    rng = random.Random(seed)
    template = _template(family)
    lines = []
    for i in range(n_lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        call = json.dumps({"name": rng.choice(_WORDS), "arguments": {"a": a, "b": b, "text": words[:20]}})
        lines += [
            words.capitalize() + rng.choice([".", "?", "!", ","]),
            f"{a} + {b} = {a + b}. {a} * {b} = {a * b}.",
            f"<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>",
            f'<tool_response>\n{{"result": {a + b}}}\n</tool_response>',
        ]
        if i % 8 == 0:
            tools = [_random_tool(rng) for _ in range(rng.randint(1, 4))]
            lines.append(template.render(messages=[{"role": "user", "content": words}], tools=tools))
    return lines


# The realistic tokenizer's extra training text: what is on every machine that runs slimeish. The
# standard library's modules are code with English docstrings and comments; pydoc's topics are the
# language reference in prose. 6 MB: tokens per character on agent prompts barely moved past it.
_REALISTIC_CORPUS_CHARS = 6_000_000
_REALISTIC_VOCAB = 16384  # tokens/char on the harness prompts: 1.14-1.20x a 65k-vocab tokenizer's (32k: 1.10-1.16x)


def _realistic_corpus() -> list[str]:
    """Prose, code and docs from the local Python standard library (tests and site-packages left
    out), in a fixed order, up to `_REALISTIC_CORPUS_CHARS` characters."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [root / "pydoc_data" / "topics.py", *sorted(root.glob("*.py")), *sorted(root.glob("*/*.py"))]
    texts, size = [], 0
    for path in files:
        if path.parent.name in ("site-packages", "test", "tests") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        size += len(text)
        if size >= _REALISTIC_CORPUS_CHARS:
            break
    return texts


def _random_tool(rng: random.Random) -> dict:
    names = rng.sample(_WORDS, rng.randint(1, 3))
    kinds = ["integer", "number", "string", "boolean"]
    properties = {n: {"type": rng.choice(kinds)} for n in names}
    function: dict[str, Any] = {"name": rng.choice(_WORDS), "parameters": {"type": "object", "properties": properties}}
    if rng.random() < 0.5:
        function["description"] = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8)))
    if rng.random() < 0.5:
        function["parameters"]["required"] = names
    return {"type": "function", "function": function}


def _template(family: str):  # -> jinja2.Template, rendered as transformers does (trim/lstrip blocks)
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, ensure_ascii=False, indent=None: json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent
    )
    return env.from_string(TEMPLATES[family].read_text())


def build_tokenizer(cfg: TinyModelConfig):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits split one by one (as in Qwen), the rest byte-level, so any text round-trips.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tokens = TOKENS[cfg.family]
    realistic = cfg.tokenizer == "realistic"
    vocab_size = cfg.vocab_size or (_REALISTIC_VOCAB if realistic else 1024)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(tokens.markup),
        special_tokens=tokens.special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _synthetic_corpus(cfg.seed, cfg.family) + (_realistic_corpus() if realistic else [])
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=tokens.eos,
        pad_token=tokens.pad,
        bos_token=tokens.bos,
        additional_special_tokens=[t for t in tokens.special if t not in (tokens.eos, tokens.pad, tokens.bos)],
        model_max_length=cfg.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(tokens.markup)
    fast.chat_template = TEMPLATES[cfg.family].read_text()
    return fast


def build_model_config(cfg: TinyModelConfig, tokenizer):  # -> transformers.PretrainedConfig
    from transformers import DeepseekV3Config, Glm4MoeConfig, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    arch = cfg.arch or FAMILY_ARCH[cfg.family]
    # Llama 3.2 1B ties, Qwen3-30B-A3B and GLM-4.5 do not (the families' published small checkpoints)
    tie = cfg.tie_word_embeddings if cfg.tie_word_embeddings is not None else arch not in ("llama", *MOE_ARCHS)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.bos_token or tokenizer.pad_token),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "llama":
        return LlamaConfig(**common, attention_bias=False, mlp_bias=False)
    if arch == "qwen3_moe":
        # head_dim is not a parameter of Qwen3MoeConfig, but Qwen3-MoE checkpoints carry it (and
        # the attention reads it): passed through as an extra key, as from_pretrained does
        moe: dict[str, Any] = {
            "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "head_dim": cfg.hidden_size // cfg.num_heads,
        }
        return Qwen3MoeConfig(**common, **moe, attention_bias=False)
    if arch == "glm4_moe":
        # GLM-4.5-Air's routing and attention (its config.json), scaled down; no MTP weights, as
        # transformers loads and saves none
        glm: dict[str, Any] = {
            "n_routed_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "partial_rotary_factor": 0.5,
            "use_qk_norm": False,
            "head_dim": cfg.hidden_size // cfg.num_heads,
        }
        return Glm4MoeConfig(**common, **glm, attention_bias=True)
    if arch == "deepseek_v3":
        # every head has its own k and v from the kv latent (V3: num_key_value_heads = num_attention_heads)
        return DeepseekV3Config(**(common | {"num_key_value_heads": cfg.num_heads}), **_deepseek_v3(cfg))
    return Qwen3Config(**common, head_dim=cfg.hidden_size // cfg.num_heads, attention_bias=False)


def _deepseek_v3(cfg: TinyModelConfig) -> dict[str, Any]:
    """DeepSeek-V3's config.json scaled down: latent ranks below the width (q: half, kv: a
    quarter); per head a rotary part and k (nope) and v parts twice its size, as V3's 64/128/128;
    routing within the best topk_group of n_group expert groups with num_experts_per_tok = 2 x
    topk_group (V3: 8 of 256 in 4 of 8 groups; here 2 groups and the best half of them), 1 shared
    expert, the first layer dense. YaRN off (its rope_scaling is for contexts past 4k) and no MTP
    layer (next-token prediction only)."""
    k, groups = cfg.experts_per_token, 2
    if k not in (2, 4) or cfg.num_experts % groups or cfg.num_experts // groups < 2:
        raise ValueError(
            "deepseek_v3: --experts-per-token must be 2 or 4 (2 in each chosen one of the 2 expert groups) and "
            "--num-experts even and at least 4 (a group's score sums its best 2 experts)"
        )
    rope = cfg.hidden_size // cfg.num_heads // 2
    return {
        "n_routed_experts": cfg.num_experts,
        "num_experts_per_tok": k,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": groups,
        "topk_group": k // 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "q_lora_rank": cfg.hidden_size // 2,
        "kv_lora_rank": cfg.hidden_size // 4,
        "qk_nope_head_dim": 2 * rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": 2 * rope,
        "rope_interleave": True,
        "num_mtp_layers": 0,
        "attention_bias": False,
    }


def make_tiny_model(out_dir: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """Write tokenizer + randomly initialised model to `out_dir` in Hugging Face format."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    cfg = cfg or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(cfg)
    model_config = build_model_config(cfg, tokenizer)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    _trained_correction_bias(model)
    stops = tokenizer.convert_tokens_to_ids(TOKENS[cfg.family].stops)
    model.generation_config = GenerationConfig(
        eos_token_id=stops if len(stops) > 1 else stops[0], pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(out, safe_serialization=True)
    _publish_config_keys(out)
    tokenizer.save_pretrained(out)
    _inline_chat_template(out, tokenizer.chat_template)
    return out


def _trained_correction_bias(model) -> None:
    """GLM-4.5's and DeepSeek-V3's routers add a per-expert score-correction bias before top-k; a fresh model's is
    zero, a trained one's is not. A random one, so the bias path is exercised end to end."""
    import torch

    gen = torch.Generator().manual_seed(0)
    for layer in model.model.layers:
        bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
        if bias is not None:  # the size of the sigmoid scores' spread at this init
            bias.copy_(0.02 * torch.randn(bias.shape, generator=gen))


def ensure_tiny_model(out_dir: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """`out_dir` if a model is already there (an earlier run), else a new tiny model written there."""
    out = Path(out_dir)
    return out if (out / "config.json").exists() else make_tiny_model(out, cfg)


def _publish_config_keys(out: Path) -> None:
    """Write config.json with the keys the family's published checkpoints use: transformers v5
    saves Qwen3-MoE's `num_experts` under its internal alias `num_local_experts` (it reads both)."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    if config.get("model_type") == "qwen3_moe" and "num_local_experts" in config:
        config["num_experts"] = config.pop("num_local_experts")
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _inline_chat_template(out: Path, template: str) -> None:
    """Keep the chat template inside tokenizer_config.json, where every loader version finds it."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out / "chat_template.jinja").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="slimeish make-tiny-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output directory (created)")
    add_dataclass_args(parser, TinyModelConfig, "model")
    args = parser.parse_args(argv)
    out = make_tiny_model(args.out, from_namespace(TinyModelConfig, args))
    print(f"wrote {out}")
