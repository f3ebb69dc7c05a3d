"""slime's MODEL_ARGS (Megatron's architecture flags) on a `slimeish train` line: the architecture is
read from --hf-checkpoint's config.json, so each flag is checked against it at start-up. A launch
script's model flags that agree are accepted; one that disagrees stops the run naming both values,
since training a model other than the one the flags describe would change results unseen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# slime flag (underscored) -> the checkpoint's value it must equal, from its HF config and model shape.
FACTS = {
    "num_layers": lambda c, s: s.num_layers,
    "hidden_size": lambda c, s: s.hidden_size,
    "ffn_hidden_size": lambda c, s: c.intermediate_size,
    "num_attention_heads": lambda c, s: s.num_heads,
    "num_query_groups": lambda c, s: s.num_kv_heads,
    "kv_channels": lambda c, s: s.head_dim,
    "norm_epsilon": lambda c, s: c.rms_norm_eps,
    "rotary_base": lambda c, s: _rope_theta(c),
    "vocab_size": lambda c, s: s.vocab_size,
    "max_position_embeddings": lambda c, s: c.max_position_embeddings,
    "untie_embeddings_and_output_weights": lambda c, s: not s.tie_word_embeddings,
    "add_qkv_bias": lambda c, s: s.qkv_bias,
    "qk_layernorm": lambda c, s: s.qk_norm,
    # What every model slimeish builds (Llama/Qwen families) has: SwiGLU MLPs, RMSNorm, RoPE, no linear biases.
    "swiglu": lambda c, s: True,
    "group_query_attention": lambda c, s: True,
    "use_rotary_position_embeddings": lambda c, s: True,
    "disable_bias_linear": lambda c, s: True,
    "normalization": lambda c, s: "RMSNorm",
    "position_embedding_type": lambda c, s: "rope",
}
FLAGS = [f"--{name.replace('_', '-')}" for name in FACTS]
BOOLEAN = {"untie_embeddings_and_output_weights", "add_qkv_bias", "qk_layernorm", "swiglu", "group_query_attention",
           "use_rotary_position_embeddings", "disable_bias_linear"}  # fmt: skip


def as_arg(flag: str, values: list[str]) -> list[str]:
    """A MODEL_ARGS flag as one `--model-arg name=value` (a boolean flag's value is true)."""
    name = flag.removeprefix("--").replace("-", "_")
    return ["--model-arg", f"{name}={values[0] if values else 'true'}"]


def check_model_args(model_args: list[str], model_path: Path) -> None:
    """Raise ValueError naming each MODEL_ARGS flag whose value differs from the checkpoint's."""
    if not model_args:
        return
    from transformers import AutoConfig

    from slimeish.trainer.model import model_shape

    config = AutoConfig.from_pretrained(model_path)
    shape = model_shape(config)
    wrong = []
    for arg in model_args:
        name, _, given = arg.partition("=")
        expected = FACTS[name](config, shape)
        if not _same(given, expected):
            wrong.append(f"--{name.replace('_', '-')} {given} (the checkpoint: {expected})")
    if wrong:
        raise ValueError(
            f"slime's MODEL_ARGS disagree with {model_path}/config.json, which the model is built from: "
            f"{', '.join(wrong)}; drop them or point --hf-checkpoint at the model they describe"
        )


def _rope_theta(config: Any) -> Any:
    """transformers 5 keeps it in `rope_parameters`, older versions on the config."""
    return (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or config.__dict__.get("rope_theta")


def _same(given: str, expected: Any) -> bool:
    if isinstance(expected, bool):
        return expected is (given == "true")
    if isinstance(expected, (int, float)):
        return float(given) == float(expected)
    return given.lower() == str(expected).lower()
