"""Configuration of the embedded engine (`slimeish engine`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimeish.common.config import help_field


@dataclass(kw_only=True)
class EngineConfig:
    model: str = help_field(
        help="Hugging Face checkpoint directory (Llama, Qwen2, Qwen3, Qwen3-MoE, GLM-4.5 or DeepSeek-V3)"
    )
    host: str = help_field("127.0.0.1", help="address to listen on")
    port: int = help_field(30000, help="TCP port to listen on")
    device: Literal["cpu", "cuda"] = help_field("cpu", help="where the model and KV cache live")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = help_field(
        "auto", help="parameter/KV dtype; auto keeps the checkpoint's dtype (float32 on CPU if it is half)"
    )
    max_running_requests: int = help_field(64, help="sequences running (decoded together) at most")
    context_length: int | None = help_field(
        None, help="max prompt + output tokens per sequence (default: the model's max_position_embeddings)"
    )
    max_total_tokens: int | None = help_field(
        None, help="KV pool size in tokens, for running sequences and the prefix cache (over --mem-fraction-static)"
    )
    mem_fraction_static: float = help_field(
        0.1,
        help="without --max-total-tokens, the share of the device's memory (CPU: physical RAM) for the KV pool "
        "and the decode view (at most 256 MiB)",
    )
    page_size: int = help_field(16, help="tokens per KV page: the unit of allocation and of prefix-cache matches")
    chunked_prefill_size: int = help_field(
        2048, help="prompt tokens per prefill forward: attention memory is O(chunk x context), never prompt^2"
    )
    disable_radix_cache: bool = help_field(False, help="no prefix cache: every prompt is prefilled in full")
    max_request_sequences: int = help_field(
        256, help="sequences one /generate request may ask for (prompts x n); more is a 400, not a stalled engine"
    )
    max_prefill_tokens: int = help_field(
        2048,
        help="prompt tokens prefilled in one step at most; requests and /health are answered only between "
        "steps, so a larger step holds them longer during a long prefill",
    )
    cpu_threads: int = help_field(
        1, help="torch intra-op threads on CPU; small models decode fastest with 1; threads on busy cores stall"
    )
    served_model_name: str | None = help_field(None, help="model id reported by /v1/models (default: --model)")
    weight_version: int = help_field(0, help="initial weight version reported in meta_info.weight_version")
    log_level: str = help_field("warning", help="uvicorn log level")
