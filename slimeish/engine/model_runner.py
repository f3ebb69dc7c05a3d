"""The model runner: a Hugging Face causal LM plus a paged KV cache, one forward per call.

The model's own modules run the forward (embedding, decoder layers, rotary, norm, head), so any
Llama / Qwen2 / Qwen3 / Qwen3-MoE / GLM-4.5 / DeepSeek-V3 checkpoint works unchanged; dense
Llama-family layers run the same math as fused ops (`fused_decoder`). Two things are ours:

* `PagedKV` replaces HF's cache: per layer one pool of token slots `[kv_heads, slots, head_dim]`
  (DeepSeek-V3: its MLA latents, see `mla`),
  handed out in pages (`kv_cache.PagePool` keeps the books). A sequence's KV is wherever its page
  table says; each forward writes the new tokens' K/V into their slots. A prefill chunk gathers
  the pages it attends to (whole pages: one copy per page, not one per token); a decode step reads
  the decode view (`decode_view`), where each decoding sequence's KV stays contiguous from step
  to step. Memory grows with the tokens actually held, not with rows x context (the view is
  bounded by `DECODE_VIEW_BYTES`), and pages can be shared (the prefix cache).
* The attention mask is built here, once per forward, and handed to every layer: a key position is
  visible to a query iff it is at or before the query's own position. It is `[n, 1, queries,
  keys]`: one token per decoding sequence, never a whole prompt squared. A prefill chunk on CPU
  has no mask: `attention.ChunkSpan` tells the layers where the chunk starts, and
  `attention.paged_attention` needs nothing more. Prompts admitted in the same step share one
  forward (right-padded to the longest): for a model this small a forward's fixed cost (the
  layers' Python) is most of a short prompt's prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from slimeish.engine import mla
from slimeish.engine.attention import ATTN_IMPLEMENTATION, ChunkSpan, MixedStep
from slimeish.engine.decode_view import DecodeView
from slimeish.engine.fused_decoder import FUSED_TYPES, FusedDecoder
from slimeish.engine.lora import LoraServing
from slimeish.engine.moe import RouteRecorder, expert_target, moe_routers

_SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "glm4_moe", *mla.MLA_TYPES)
# prompt positions per lm-head call when prompt log-probs are asked for (bounds the logits held at once)
_LOGPROB_CHUNK = 256
# the most memory the decode view (each decoding sequence's KV kept contiguous) may take beside the pool
DECODE_VIEW_BYTES = 256 << 20


class PagedKV:
    """Per-layer K/V slot pools; duck-types the `update` of a transformers Cache for one forward.
    What a layer caches is its attention's business: K and V heads (`[heads, head_dim]` each), or
    an MLA layer's two latents (`mla.latent_shapes`); `key_shape` and `value_shape` say which."""

    def __init__(
        self, n_layers: int, slots: int, page_size: int, key_shape: tuple[int, int], value_shape: tuple[int, int],
        dtype, device,
    ):  # fmt: skip
        # `empty`, not `zeros`: on CPU the pool is then only backed by memory as pages get used.
        # Slots a mask hides still enter attention as 0 x value, so a page is zeroed when handed
        # out (`clear`): uninitialised memory may hold NaN, and 0 x NaN is NaN.
        # Head-major (`[heads, slots, dim]`): a gathered page is one contiguous block per head, so a
        # decode step's keys come out as `[heads, n, kv_len, dim]`, contiguous, which `attention`
        # multiplies without another copy.
        (kh, kd), (vh, vd) = key_shape, value_shape
        self.keys = [torch.empty(kh, slots, kd, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.empty(vh, slots, vd, dtype=dtype, device=device) for _ in range(n_layers)]
        self.page_size = page_size
        self.view = DecodeView(n_layers, key_shape, value_shape, dtype, device, page_size, DECODE_VIEW_BYTES)
        self._set_step(torch.zeros(0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long))
        self.mixed: MixedStep | None = None

    def clear(self, slots: torch.Tensor) -> None:
        for buf in (*self.keys, *self.values):
            buf.index_fill_(1, slots, 0)

    def _set_step(self, write: torch.Tensor, read: torch.Tensor | int) -> None:
        """`write`: the slot of each new token (`[n * width]`); `read`: per sequence, its page table
        (`[n, pages]`, padded with any valid page that the mask hides), or the positions a decode
        step reads from the decode view (arranged by the caller: `view.arrange`)."""
        self.write, self.read = write, read

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write this step's K/V (`[n, heads, width, dim]`) and return what each sequence sees,
        `[n, heads, kv_len, dim]`: rows of the decode view read in place, or else a transposed view
        of a contiguous `[heads, n, ...]` gather of its pages. `index_copy_`/`index_select` over flat
        slots and whole pages: an order of magnitude faster on CPU than advanced indexing, and
        gathering pages copies `page_size` times fewer (and longer) blocks than gathering slots."""
        if self.mixed is not None:  # see `attention.MixedStep`
            d = self.mixed.decode
            rows = (self._step(self.keys[layer_idx], self.view.keys, layer_idx, key, d),
                    self._step(self.values[layer_idx], self.view.values, layer_idx, value, d))  # fmt: skip
            self.mixed.rows = rows
            return key, value
        return (self._step(self.keys[layer_idx], self.view.keys, layer_idx, key),
                self._step(self.values[layer_idx], self.view.values, layer_idx, value))  # fmt: skip

    def _step(
        self, buf: torch.Tensor, views: list[torch.Tensor], layer_idx: int, new: torch.Tensor, decode: int = 0
    ) -> torch.Tensor:
        """`decode`: a `MixedStep`'s packed row, whose first `decode` tokens are the view's rows."""
        n, heads, width, dim = new.shape
        buf.index_copy_(1, self.write, new.transpose(0, 1).reshape(heads, n * width, dim))
        if isinstance(self.read, int):  # the decode view's rows
            rows = new[0, :, :decode].transpose(0, 1)[:, :, None] if decode else new
            return self.view.step(views[layer_idx], rows, self.read)
        kv_len = self.read.shape[1] * self.page_size
        pages = buf.view(heads, -1, self.page_size, dim).index_select(1, self.read.flatten())
        return pages.view(heads, n, kv_len, dim).transpose(0, 1)


def cached_shapes(config) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per token and layer, the shapes of what `PagedKV` holds for K and V."""
    if config.model_type in mla.MLA_TYPES:
        return mla.latent_shapes(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (config.num_key_value_heads, head_dim), (config.num_key_value_heads, head_dim)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return config.num_hidden_layers * sum(h * d for h, d in cached_shapes(config)) * itemsize


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """`prompt[start:end]` of one sequence, the KV of positions before `start` already in `pages`
    (which cover `end`); `logprobs_from`: the first prompt position whose log-prob is asked for;
    `adapter`: its LoRA adapter (None: the base model)."""

    prompt: list[int]
    start: int
    end: int
    pages: list[int]
    logprobs_from: int
    adapter: str | None = None


class ModelRunner:
    """Loads a checkpoint and runs prefill chunks and batched decodes against a `PagedKV`."""

    def __init__(self, model_path: str, *, device: str, dtype: str, context_length: int | None = None):
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = _load_model(model_path, self.device, dtype)
        cfg = self.model.config
        if cfg.model_type not in _SUPPORTED_TYPES:
            raise ValueError(f"model_type {cfg.model_type!r} is not supported; expected one of {_SUPPORTED_TYPES}")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported by the embedded engine")
        self.vocab_size = int(cfg.vocab_size)
        self.context_length = min(context_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.dtype = self.model.dtype  # fixed at load; `model.dtype` walks the parameters on every read
        self.kv_bytes_per_token = kv_bytes_per_token(cfg, self.dtype)
        self.cache: PagedKV | None = None
        self.routes: RouteRecorder | None = None  # MoE models: the experts each KV slot's token took
        self.page_size = self._pad_page = 0  # set by allocate_kv
        self.lora = LoraServing(self.model)
        # dense Llama-family layers run as fused ops (fewer, cheaper calls); the modules stay for the rest
        self.fused = FusedDecoder(self.model) if cfg.model_type in FUSED_TYPES else None

    def allocate_kv(self, num_pages: int, page_size: int) -> None:
        """The KV pool: `num_pages` pages of `page_size` token slots per layer."""
        cfg = self.model.config
        self.page_size = page_size
        # one page more than the pool hands out: page `num_pages`, zeroed, pads the shorter
        # sequences of a decode batch
        self.cache = PagedKV(
            cfg.num_hidden_layers, (num_pages + 1) * page_size, page_size, *cached_shapes(cfg), self.dtype,
            self.device,
        )  # fmt: skip
        self._offsets = torch.arange(page_size, device=self.device)
        self._pad_page = num_pages
        if routers := moe_routers(self.model):
            assert self.routes is None, "allocate_kv once: the routers' hooks are registered here"
            self.routes = RouteRecorder(routers, (num_pages + 1) * page_size, cfg.num_experts_per_tok, self.device)
        self.clear_pages([num_pages])

    def clear_pages(self, pages: list[int]) -> None:
        """Zero pages about to be handed out (see `PagedKV.clear`)."""
        assert self.cache is not None, "allocate_kv first"
        if not pages:
            return
        self.cache.clear((self._longs(pages)[:, None] * self.page_size + self._offsets).flatten())

    @torch.inference_mode()
    def decode_step(
        self, tokens: list[int], positions: list[int], pages: list[list[int]], adapters: list[str | None],
        ids: list[int], prompts: list[PrefillChunk], max_tokens: int,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, list[float]]]]:  # fmt: skip
        """One token per sequence: `tokens[i]` at `positions[i]`, its KV in `pages[i]`, LoRA adapter
        `adapters[i]` (None: the base model); `ids[i]` names the sequence for the decode view, never
        reused for another. Returns the next-token logits (float32), `[n, vocab]`, and `prefill`'s
        results for `prompts` (whole prompts from position 0), which ride in the same forward
        (`attention.MixedStep`) when they can: on CPU, without adapters, not MLA (whose cache
        holds latents expanded after the cache's update), the batch in the decode view."""
        assert self.cache is not None, "allocate_kv first"
        rows = self.cache.view.arrange(ids, positions, pages, self.cache.keys, self.cache.values)
        mla_model = self.model.config.model_type in mla.MLA_TYPES
        ride = bool(prompts) and rows is not None and self.device.type == "cpu" and not mla_model
        ride = ride and not any(adapters) and not any(c.adapter for c in prompts)
        results = [] if ride else self.prefill(prompts, max_tokens)
        if rows is None:  # too big for the view: each layer gathers the pages
            with self.lora.rows(adapters):
                return self._head(self._layers([[t] for t in tokens], positions, pages)[:, 0]), results
        # the forward runs in the view's row order; the logits come back in the caller's
        order = sorted(range(len(rows)), key=rows.__getitem__)
        in_rows = lambda xs: [xs[i] for i in order]  # noqa: E731
        if ride:
            hidden = self._mixed(in_rows(tokens), in_rows(positions), in_rows(pages), prompts)
            at, rides = len(tokens), []
            for c in prompts:
                rides.append(hidden[at : at + c.end])
                at += c.end
            results = self._chunk_results(rides, prompts)
        else:
            with self.lora.rows(in_rows(adapters)):
                hidden = self._layers([[tokens[i]] for i in order], in_rows(positions), in_rows(pages), view=True)[:, 0]
        return self._head(hidden[: len(tokens)]).index_select(0, self._longs(rows)), results

    @torch.inference_mode()
    def prefill(self, chunks: list[PrefillChunk], max_tokens: int) -> list[tuple[torch.Tensor, list[float]]]:
        """Run prompt chunks, in order; returns per chunk the logits after its last token (float32,
        `[vocab]`) and the prompt's own token log-probs that the chunk's hidden states give:
        log p(prompt[p] | prompt[:p]) for `p` in `[start + 1, end]`, `p >= max(logprobs_from, 1)`,
        `p < len(prompt)`. Chunks that start a prompt (nothing cached before them) run together,
        right-padded to one width, at most `max_tokens` padded tokens a forward: a query never sees
        the padding after it, so each row is its prompt's own forward. A sequence's later chunks
        need its first, so they run after, one forward each."""
        out: list[tuple[torch.Tensor, list[float]] | None] = [None] * len(chunks)
        first = sorted((i for i, c in enumerate(chunks) if c.start == 0), key=lambda i: -chunks[i].end)
        while first:  # longest first: a group's rows have similar widths, so little padding
            width = chunks[first[0]].end
            rows = max(1, max_tokens // width)
            group, first = first[:rows], first[rows:]
            for i, result in zip(group, self._prefill_rows([chunks[i] for i in group]), strict=True):
                out[i] = result
        for i, chunk in enumerate(chunks):
            if chunk.start > 0:
                out[i] = self._prefill_rows([chunk])[0]
        return [r for r in out if r is not None]

    def _prefill_rows(self, chunks: list[PrefillChunk]) -> list[tuple[torch.Tensor, list[float]]]:
        """One forward of chunks that share their start (one chunk, or several prompts' first)."""
        width = max(c.end - c.start for c in chunks)
        tokens = [c.prompt[c.start : c.end] + [0] * (width - c.end + c.start) for c in chunks]
        with self.lora.rows([c.adapter for c in chunks]):
            hidden = self._layers(tokens, [c.start for c in chunks], [c.pages for c in chunks])
        return self._chunk_results(list(hidden), chunks)

    def _chunk_results(
        self, hidden: list[torch.Tensor], chunks: list[PrefillChunk]
    ) -> list[tuple[torch.Tensor, list[float]]]:
        """`prefill`'s results from each chunk's hidden states (`hidden[i]`: `[width, hidden]`,
        perhaps padded past the chunk)."""
        logits = self._head(torch.stack([h[c.end - c.start - 1] for h, c in zip(hidden, chunks, strict=True)]))
        results = []
        for row, (h, chunk) in enumerate(zip(hidden, chunks, strict=True)):
            first = max(chunk.logprobs_from, 1, chunk.start + 1)
            targets = chunk.prompt[first : chunk.end + 1]
            results.append((logits[row], self._token_logprobs(h[first - 1 - chunk.start :], targets)))
        return results

    def _mixed(
        self, tokens: list[int], positions: list[int], pages: list[list[int]], prompts: list[PrefillChunk]
    ) -> torch.Tensor:
        """The hidden states `[tokens + prompts' tokens, hidden]` of one forward of a decode step
        (sequences in the decode view's row order) with whole prompts packed after it
        (`attention.MixedStep`)."""
        assert self.cache is not None, "allocate_kv first"
        size = self.page_size
        ids, at = list(tokens), list(positions)
        write = [p[s // size] * size + s % size for p, s in zip(pages, positions, strict=True)]
        spans = []
        for c in prompts:
            spans.append((len(ids), len(ids) + c.end))
            ids += c.prompt[: c.end]
            at += range(c.end)
            write += [c.pages[s // size] * size + s % size for s in range(c.end)]
        kv_len = max(positions) + 1
        mask = self._mask(self._longs(positions)[:, None], kv_len)
        self.cache._set_step(self._longs(write), kv_len)
        self.cache.mixed = MixedStep(len(tokens), mask, spans)
        try:
            return self._stack(self._longs(ids)[None], self._longs(at)[None], self.cache.mixed)[0]
        finally:
            self.cache.mixed = None

    def _layers(
        self, tokens: list[list[int]], starts: list[int], pages: list[list[int]], view: bool = False
    ) -> torch.Tensor:
        """The decoder stack's hidden states `[n, width, hidden]` (before the final norm); every
        `tokens[i]` has the same width (one prompt chunk, or one token per decoding sequence).
        `view`: a decode step whose sequences are rows `0 .. n-1` of the decode view, in order."""
        assert self.cache is not None, "allocate_kv first"
        width = len(tokens[0])
        ids = self._longs([t for row in tokens for t in row]).view(len(tokens), width)
        positions = self._longs(starts)[:, None] + torch.arange(width, device=self.device)
        size = self.page_size
        if view:
            kv_len = max(starts) + 1
            write = self._longs([p[s // size] * size + s % size for p, s in zip(pages, starts, strict=True)])
            self.cache._set_step(write, kv_len)
        else:
            table = self._page_table(pages, max(starts) + width)
            kv_len = table.shape[1] * size  # whole pages: the mask hides the positions past each query
            write = table.gather(1, positions // size) * size + positions % size
            self.cache._set_step(write.flatten(), table)
        mask: torch.Tensor | ChunkSpan
        if not view and len(set(starts)) == 1 and width > 1 and self.device.type == "cpu":
            # prefill chunks sharing their start: no mask (see `attention`); a decode step's mask
            # is one row, and the split's extra small ops cost more than it there
            mask = ChunkSpan(starts[0], starts[0] + width)
        else:
            mask = self._mask(positions, kv_len)
        return self._stack(ids, positions, mask)

    def _mask(self, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """`[n, 1, width, kv_len]` for queries at `positions` (`[n, width]`): a 4D mask is used as
        given by every HF decoder layer's attention. Additive, built once: SDPA would otherwise
        turn a boolean mask into this in every layer."""
        masked = (torch.arange(kv_len, device=self.device) > positions[:, :, None])[:, None]
        mask = torch.zeros(masked.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(masked, torch.finfo(mask.dtype).min)

    def _stack(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | ChunkSpan | MixedStep):
        """The decoder stack driven directly (as `model.model.forward` does), minus its per-call
        mask building and output bookkeeping, which cost more than the layers for small models;
        fused (`fused_decoder`) when `_fused_now` says so."""
        assert self.cache is not None, "allocate_kv first"
        if fused := self._fused_now():
            return fused(ids, positions, mask, self.cache)
        if self.routes is not None:
            self.routes.write = self.cache.write
        inner = self.model.model
        hidden = inner.embed_tokens(ids)
        rope = inner.rotary_emb(hidden, positions)
        for layer in inner.layers:
            hidden = layer(
                hidden, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                position_embeddings=rope,
            )  # fmt: skip
        return hidden

    def _page_table(self, pages: list[list[int]], kv_len: int) -> torch.Tensor:
        """`[n, pages]`: the pages holding positions below `kv_len` of each sequence (padded with
        the zeroed pad page, which the mask hides)."""
        n_pages = -(-kv_len // self.page_size)
        rows = [p[:n_pages] + [self._pad_page] * (n_pages - len(p[:n_pages])) for p in pages]
        return torch.tensor(rows, device=self.device)

    def _longs(self, xs: list[int]) -> torch.Tensor:
        """A flat list of ints as a tensor: with the dtype given, `torch.tensor` skips inferring it
        (~40 % of the call for a decode batch's 64 ints; a step makes ~10 such calls)."""
        return torch.tensor(xs, dtype=torch.long, device=self.device)

    def _fused_now(self) -> FusedDecoder | None:
        """The fused decoder, unless this model has none or a row of the running forward uses a
        LoRA adapter (its delta is added by hooks on the modules)."""
        return None if self.lora.in_use else self.fused

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        if fused := self._fused_now():
            return fused.head(hidden).float()
        return self.model.lm_head(self.model.model.norm(hidden)).float()

    def _token_logprobs(self, hidden: torch.Tensor, targets: list[int]) -> list[float]:
        """log p(targets[i]) under the head at `hidden[i]`. The head runs in chunks: a long
        prompt's full `[positions, vocab]` logits would not fit."""
        out: list[float] = []
        for a in range(0, len(targets), _LOGPROB_CHUNK):
            t = torch.tensor(targets[a : a + _LOGPROB_CHUNK], device=self.device)
            logits = self._head(hidden[a : a + len(t)])
            out += torch.log_softmax(logits, dim=-1).gather(1, t[:, None])[:, 0].tolist()
        return out

    def routed_experts(self, pages: list[int], length: int) -> torch.Tensor:
        """`[length, moe_layers, top_k]` int32: the experts positions `0 .. length-1` of the
        sequence whose KV lives in `pages` were routed to."""
        assert self.routes is not None, "not a Mixture-of-Experts model"
        positions = torch.arange(length, device=self.device)
        table = torch.tensor(pages, device=self.device, dtype=torch.long)
        slots = table[positions // self.page_size] * self.page_size + positions % self.page_size
        return self.routes.rows(slots)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        # one sequence of ids decodes to one string (the stub's list[str] is for batched input)
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

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
        targets = {name: params[name] if name in params else expert_target(name, params) for name in tensors}
        unknown = sorted(name for name, target in targets.items() if target is None)
        if unknown:
            raise ValueError(f"unknown parameter names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        found = {name: target for name, target in targets.items() if target is not None}
        for name, tensor in tensors.items():
            if found[name].shape != tensor.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(found[name].shape)}")
        for name, tensor in tensors.items():
            found[name].copy_(tensor)
        return len(tensors)


def _load_model(model_path: str, device: torch.device, dtype: str):
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype, attn_implementation=ATTN_IMPLEMENTATION)
    if dtype == "auto" and device.type == "cpu" and model.dtype in (torch.float16, torch.bfloat16):
        model = model.float()  # half-precision matmuls on CPU are slow and less exact
    # transformers wraps `to` with functools.wraps, whose stub does not bind `self`
    return model.to(device).eval().requires_grad_(False)  # type: ignore[arg-type]
