"""The model runner: a Hugging Face causal LM plus a slot-based KV cache, one batched forward per step.

The model's own modules run the forward (embedding, decoder layers, rotary, norm, head), so any
Llama / Qwen2 / Qwen3 checkpoint works unchanged. Two things are ours:

* `SlotKVCache` replaces HF's cache. It is preallocated as `[rows, kv_heads, context, head_dim]`
  per layer; sequence `i` of the running batch lives in row `i`. Rows are kept compact (a finished
  sequence's row is filled by moving the last one in), so a decode step reads the contiguous view
  `[:batch, :, :longest]` without gathering, and appending a token is one indexed write.
* The attention mask is built here, once per step, and handed to every layer: a key position is
  visible to a query iff it is at or before the query's own position. Padding in a batched prefill
  therefore writes KV entries beyond a prompt's end that nothing reads before decode overwrites them.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

_SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")
# prompt positions per lm-head call when prompt log-probs are asked for (bounds the logits held at once)
_LOGPROB_CHUNK = 256


class SlotKVCache:
    """Per-layer K/V buffers indexed by batch row; duck-types the `update` of a transformers Cache."""

    def __init__(self, n_layers: int, rows: int, kv_heads: int, context: int, head_dim: int, dtype, device):
        shape = (rows, kv_heads, context, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self._rows = torch.arange(rows, device=device)
        self._set_step(0, torch.zeros(0, 1, dtype=torch.long, device=device), 0)

    def _set_step(self, first_row: int, positions: torch.Tensor, kv_len: int) -> None:
        self.first_row, self.positions, self.kv_len = first_row, positions, kv_len

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write this step's K/V (`[n, kv_heads, t, head_dim]`) and return everything visible."""
        n = key.shape[0]
        rows = self._rows[self.first_row : self.first_row + n, None]
        self.keys[layer_idx][rows, :, self.positions] = key.transpose(1, 2)
        self.values[layer_idx][rows, :, self.positions] = value.transpose(1, 2)
        span = slice(self.first_row, self.first_row + n)
        return self.keys[layer_idx][span, :, : self.kv_len], self.values[layer_idx][span, :, : self.kv_len]

    def move_row(self, src: int, dst: int) -> None:
        for buf in (*self.keys, *self.values):
            buf[dst] = buf[src]


class ModelRunner:
    """Loads a checkpoint and runs batched prefill/decode forwards against a `SlotKVCache`."""

    def __init__(self, model_path: str, *, device: str, dtype: str, rows: int, context_length: int | None):
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = _load_model(model_path, self.device, dtype)
        cfg = self.model.config
        if cfg.model_type not in _SUPPORTED_TYPES:
            raise ValueError(f"model_type {cfg.model_type!r} is not supported; expected one of {_SUPPORTED_TYPES}")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported by the embedded engine")
        self.vocab_size = int(cfg.vocab_size)
        self.context_length = min(context_length or min(cfg.max_position_embeddings, 4096), cfg.max_position_embeddings)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cache = SlotKVCache(
            cfg.num_hidden_layers, rows, cfg.num_key_value_heads, self.context_length, head_dim,
            self.model.dtype, self.device,
        )  # fmt: skip
        self._arange = torch.arange(self.context_length, device=self.device)

    @torch.inference_mode()
    def forward(self, tokens: list[list[int]], first_row: int, starts: list[int]) -> torch.Tensor:
        """Run `tokens[i]` (continuing at position `starts[i]`) in row `first_row + i`.

        Returns the logits (float32) at each sequence's last given token, shape `[n, vocab]`.
        """
        return self._head(self._last(self._layers(tokens, first_row, starts), tokens))

    @torch.inference_mode()
    def prefill(
        self, prompts: list[list[int]], first_row: int, logprobs_from: list[int]
    ) -> tuple[torch.Tensor, list[list[float]]]:
        """`forward` over whole prompts, plus each prompt's own token log-probs at positions
        `>= max(logprobs_from[i], 1)` (position 0 has none: nothing precedes it)."""
        hidden = self._layers(prompts, first_row, [0] * len(prompts))
        pairs = enumerate(zip(prompts, logprobs_from, strict=True))
        prompt_logprobs = [self._token_logprobs(hidden[i], p, s) for i, (p, s) in pairs]
        return self._head(self._last(hidden, prompts)), prompt_logprobs

    def _layers(self, tokens: list[list[int]], first_row: int, starts: list[int]) -> torch.Tensor:
        """The decoder stack's hidden states `[n, width, hidden]` (before the final norm)."""
        width = max(map(len, tokens))
        ids = torch.tensor([t + [0] * (width - len(t)) for t in tokens], device=self.device)
        positions = torch.tensor(starts, device=self.device)[:, None] + self._arange[:width]
        kv_len = max(starts) + width
        # [n, 1, width, kv_len]; a 4D mask is used as given by every HF decoder layer's attention.
        visible = (self._arange[:kv_len] <= positions[:, :, None])[:, None]
        self.cache._set_step(first_row, positions, kv_len)
        # The decoder stack driven directly (as `model.model.forward` does), minus its per-call
        # mask building and output bookkeeping, which cost more than the layers for small models.
        inner = self.model.model
        hidden = inner.embed_tokens(ids)
        rope = inner.rotary_emb(hidden, positions)
        for layer in inner.layers:
            hidden = layer(
                hidden, attention_mask=visible, position_ids=positions, past_key_values=self.cache,
                position_embeddings=rope,
            )  # fmt: skip
        return hidden

    def _last(self, hidden: torch.Tensor, tokens: list[list[int]]) -> torch.Tensor:
        if hidden.shape[1] == 1:
            return hidden[:, 0]
        ends = torch.tensor([len(t) - 1 for t in tokens], device=self.device)
        return hidden[torch.arange(len(tokens), device=self.device), ends]

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(hidden)).float()

    def _token_logprobs(self, hidden: torch.Tensor, tokens: list[int], start: int) -> list[float]:
        """log p(tokens[p] | tokens[:p]) for p in [max(start, 1), len): position p - 1 predicts p.
        The head runs in chunks: a long prompt's full `[positions, vocab]` logits would not fit."""
        first = max(start, 1)
        if first >= len(tokens):  # the common case: no prompt log-probs asked for
            return []
        targets = torch.tensor(tokens[first:], device=self.device)
        out: list[float] = []
        for a in range(0, len(targets), _LOGPROB_CHUNK):
            t = targets[a : a + _LOGPROB_CHUNK]
            logits = self._head(hidden[first - 1 + a : first - 1 + a + len(t)])
            out += torch.log_softmax(logits, dim=-1).gather(1, t[:, None])[:, 0].tolist()
        return out

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        # one sequence of ids decodes to one string (the stub's list[str] is for batched input)
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

    @torch.inference_mode()
    def load_state_dict_file(self, path: str | Path) -> int:
        """Copy tensors with HF parameter names from a safetensors file into the model; returns the count."""
        return self._copy_in(load_file(str(path), device="cpu"))

    @torch.inference_mode()
    def load_checkpoint_dir(self, model_path: str | Path) -> int:
        """Copy every `*.safetensors` shard of an HF checkpoint directory into the model."""
        shards = sorted(Path(model_path).glob("*.safetensors"))
        if not shards:
            raise ValueError(f"no *.safetensors files in {model_path}")
        return sum(self.load_state_dict_file(p) for p in shards)

    def _copy_in(self, tensors: dict[str, torch.Tensor]) -> int:
        params = self.model.state_dict(keep_vars=True)  # tied weights appear under both names
        unknown = sorted(set(tensors) - set(params))
        if unknown:
            raise ValueError(f"unknown parameter names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        for name, tensor in tensors.items():
            if params[name].shape != tensor.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(params[name].shape)}")
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
        return len(tensors)


def _load_model(model_path: str, device: torch.device, dtype: str):
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype, attn_implementation="sdpa")
    if dtype == "auto" and device.type == "cpu" and model.dtype in (torch.float16, torch.bfloat16):
        model = model.float()  # half-precision matmuls on CPU are slow and less exact
    # transformers wraps `to` with functools.wraps, whose stub does not bind `self`
    return model.to(device).eval().requires_grad_(False)  # type: ignore[arg-type]
