"""Megatron-core `GPTModel` built from a Hugging Face config (Llama, Qwen2, Qwen3, Qwen3-MoE, GLM-4.5, DeepSeek-V3).

The layer spec is Megatron's local (non-Transformer-Engine) spec with one change: the core
attention is `SDPACoreAttention`, a thin wrapper over `torch.nn.functional.scaled_dot_product_attention`
that runs on CPU and GPU alike (causal, GQA-aware). Batches are right-padded, so causal
attention never lets a real token see padding and no attention mask is needed. Qwen3-MoE layers
are Megatron's `MoELayer` (top-k softmax router, SequentialMLP experts, all-gather dispatcher,
expert parallel 1) with `HostTopKRouter` as the router. GLM-4.5 (`glm4_moe`) adds what Megatron
has names for: sigmoid scores with a score-correction bias before top-k (`expert_bias`), group-limited
top-k, the routed weights' scaling factor, a shared expert, the first `first_k_dense_replace` layers
dense (`moe_layer_freq`), partial rotary (`rotary_percent`) and q/k/v biases. DeepSeek-V3
(`deepseek_v3`) routes as GLM-4.5 does and attends with Megatron's `MLASelfAttention` (multi-head
latent attention: low-rank q and kv projections, a decoupled rotary part of q/k shared by all heads).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
from megatron.core.transformer import MLATransformerConfig, TransformerConfig
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3")
# Routers with sigmoid scores, a score-correction bias, groups, scaling and shared experts (noaux_tc)
_SIGMOID_ROUTED = ("glm4_moe", "deepseek_v3")
_SUPPORTED_ROPE = ("default", "linear", "llama3")


class SDPACoreAttention(MegatronModule):
    """Core attention for Megatron's `SelfAttention`: [s, b, heads, d] in, [s, b, heads*d] out.

    Megatron's own `DotProductAttention` materialises the score matrix in a CUDA-oriented global
    buffer; SDPA picks the best kernel per device (flash on GPU, a fused CPU kernel on CPU).
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        **_: object,
    ):
        super().__init__(config=config)
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPACoreAttention supports neither packed sequences nor attention bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, heads, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class HostRotaryEmbedding(RotaryEmbedding):
    """RoPE that stays on the device of its `inv_freq`.

    Megatron's `RotaryEmbedding.get_emb` moves a CPU `inv_freq` to `torch.cuda.current_device()`
    on first use, which fails on a CPU-only host. Only this model's instance gets the subclass
    (see `_keep_rotary_on_host`), so nothing in Megatron is patched globally.
    """

    def get_emb(self, max_seq_len: int, offset: int = 0) -> Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]


class HostTopKRouter(TopKRouter):
    """Megatron's top-k router with a plain linear gate.

    megatron-core 0.16.1's `TopKRouter.gating` moves a CPU weight to `torch.cuda.current_device()`
    and computes the logits through a helper that names Transformer Engine's GEMM without
    importing it (a NameError where TE is absent, on CPU and GPU alike). The logits are the same
    linear map, in the input's dtype as Megatron's default `moe_router_dtype` has them.
    """

    def gating(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight.to(input.dtype), None if self.bias is None else self.bias.to(input.dtype))


@dataclass(frozen=True)
class MLAShape:
    """DeepSeek-V3's multi-head latent attention widths (HF names)."""

    q_lora_rank: int  # 0: q projected in one step (`q_proj`)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelShape:
    """The HF facts the converter needs besides the state dict."""

    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int  # Hugging Face vocab: logits are cut to this
    padded_vocab_size: int  # Megatron's embedding rows (multiple of 128 * tensor parallel)
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    num_experts: int = 0  # 0: dense MLPs
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0
    first_dense_layers: int = 0  # MoE models: the leading layers with a dense MLP (GLM-4.5)
    shared_expert_size: int = 0  # MoE models: the shared experts' MLP width (0: none)
    expert_bias: bool = False  # MoE routers add a score-correction bias before top-k (GLM-4.5, DeepSeek-V3)
    mla: MLAShape | None = None  # DeepSeek-V3: latent attention (no fused qkv)

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.num_experts) and layer >= self.first_dense_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))


def model_shape(hf_config, tensor_parallel: int = 1) -> ModelShape:
    if hf_config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {hf_config.model_type!r} not supported; expected one of {SUPPORTED_MODEL_TYPES}")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    multiple = 128 * tensor_parallel
    glm = hf_config.model_type == "glm4_moe"
    sigmoid_routed = hf_config.model_type in _SIGMOID_ROUTED
    return ModelShape(
        model_type=hf_config.model_type,
        num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        head_dim=head_dim,
        hidden_size=hf_config.hidden_size,
        vocab_size=hf_config.vocab_size,
        padded_vocab_size=math.ceil(hf_config.vocab_size / multiple) * multiple,
        tie_word_embeddings=bool(hf_config.tie_word_embeddings),
        qkv_bias=hf_config.model_type == "qwen2" or (glm and hf_config.attention_bias),
        qk_norm=hf_config.model_type in ("qwen3", "qwen3_moe") or (glm and hf_config.use_qk_norm),
        num_experts=(hf_config.n_routed_experts if sigmoid_routed else getattr(hf_config, "num_experts", 0)) or 0,
        experts_per_token=getattr(hf_config, "num_experts_per_tok", 0) or 0,
        moe_ffn_hidden_size=getattr(hf_config, "moe_intermediate_size", 0) or 0,
        first_dense_layers=hf_config.first_k_dense_replace if sigmoid_routed else 0,
        shared_expert_size=hf_config.moe_intermediate_size * hf_config.n_shared_experts if sigmoid_routed else 0,
        expert_bias=sigmoid_routed,
        mla=_mla_shape(hf_config) if hf_config.model_type == "deepseek_v3" else None,
    )


def _mla_shape(hf_config) -> MLAShape:
    return MLAShape(
        q_lora_rank=hf_config.q_lora_rank or 0,
        kv_lora_rank=hf_config.kv_lora_rank,
        qk_nope_head_dim=hf_config.qk_nope_head_dim,
        qk_rope_head_dim=hf_config.qk_rope_head_dim,
        v_head_dim=hf_config.v_head_dim,
    )


def transformer_config(
    hf_config,
    *,
    params_dtype: torch.dtype,
    use_gpu: bool,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    expert_parallel: int = 1,
) -> TransformerConfig:
    shape = model_shape(hf_config, tensor_parallel)
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} not supported (SwiGLU only)")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported")
    if shape.model_type not in ("qwen2", "glm4_moe") and getattr(hf_config, "attention_bias", False):
        # Llama/Qwen3/DeepSeek-V3 attention_bias also puts a bias on o_proj, which Megatron's spec
        # cannot hold (GLM-4.5's is on q/k/v only, as Qwen2's).
        raise ValueError(f"attention_bias=True is not supported for {shape.model_type}")
    config_class, mla = (
        (MLATransformerConfig, _mla_config(hf_config, shape, tensor_parallel)) if shape.mla else (TransformerConfig, {})
    )
    return config_class(
        **_moe_config(hf_config, shape, expert_parallel),
        **mla,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm or shape.mla is not None,  # MLA: the q and kv latents' norms
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        sequence_parallel=False,
        use_cpu_initialization=not use_gpu,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint
    )


def _moe_config(hf_config, shape: ModelShape, expert_parallel: int = 1) -> dict:
    """Megatron's MoE fields for a Qwen3-MoE or GLM-4.5 config (none for a dense model)."""
    if expert_parallel > 1 and (not shape.num_experts or shape.num_experts % expert_parallel):
        raise ValueError(
            f"--expert-model-parallel-size {expert_parallel} must divide the routed experts "
            f"({shape.num_experts} in this {shape.model_type} model)"
            + ("" if shape.num_experts else ": expert parallel is for MoE models only")
        )
    if not shape.num_experts:
        return {}
    common = dict(
        num_moe_experts=shape.num_experts,
        moe_router_topk=shape.experts_per_token,
        moe_ffn_hidden_size=shape.moe_ffn_hidden_size,
        expert_model_parallel_size=expert_parallel,
        # alltoall creates a CUDA stream when built; all-gather moves nothing at expert parallel 1
        # and, on CPU ranks, runs over gloo as `HostAllGatherTokenDispatcher` (expert_parallel.py).
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
    )
    if shape.model_type in _SIGMOID_ROUTED:
        return common | _sigmoid_router(hf_config, shape)
    if getattr(hf_config, "decoder_sparse_step", 1) != 1 or getattr(hf_config, "mlp_only_layers", None):
        raise ValueError("Qwen3-MoE with dense layers between the MoE ones (decoder_sparse_step, mlp_only_layers)")
    return common | dict(
        # HF: softmax over all experts, top-k, renormalised when norm_topk_prob, which equals
        # Megatron's softmax over the top-k logits; without it, Megatron's pre-softmax top-k.
        moe_router_pre_softmax=not hf_config.norm_topk_prob,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=hf_config.router_aux_loss_coef,
    )


def _sigmoid_router(hf_config, shape: ModelShape) -> dict:
    """GLM-4.5's and DeepSeek-V3's router (noaux_tc) in Megatron's terms. HF: sigmoid scores; top-k over scores +
    correction bias within the `topk_group` best of `n_group` groups (a group's score: the sum of
    its best two); the chosen experts' unbiased scores, renormalised, times routed_scaling_factor.
    The bias is no Megatron-updated `expert_bias` (see `_attach_expert_bias`), and there is no
    load-balancing loss: the published configs carry no coefficient."""
    k, groups, group_topk = shape.experts_per_token, hf_config.n_group, hf_config.topk_group
    if not hf_config.norm_topk_prob and k > 1:
        raise ValueError(f"{shape.model_type} with norm_topk_prob=False: Megatron's sigmoid router always renormalises")
    if groups > 1 and k // group_topk != 2:
        # Megatron scores a group by the sum of its top (topk // group_topk) experts, HF by its top 2
        raise ValueError(
            f"{shape.model_type} group routing with num_experts_per_tok // topk_group = {k // group_topk} (needs 2)"
        )
    return dict(
        moe_router_score_function="sigmoid",
        moe_router_num_groups=groups if groups > 1 else None,
        moe_router_group_topk=group_topk if groups > 1 else None,
        moe_router_topk_scaling_factor=hf_config.routed_scaling_factor,
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_shared_expert_intermediate_size=shape.shared_expert_size,
        moe_layer_freq=[int(shape.is_moe_layer(i)) for i in range(shape.num_layers)],
    )


def _mla_config(hf_config, shape: ModelShape, tensor_parallel: int) -> dict:
    """MLATransformerConfig's fields for DeepSeek-V3. RoPE is plain ("rope" with no scaling:
    softmax scale 1/sqrt(qk_head_dim), as HF's without YaRN); HF's `rope_interleave` layout is
    the one Megatron's MLA rotary reads (even dims, then odd), so no weight is permuted."""
    mla = shape.mla
    assert mla is not None
    if tensor_parallel > 1:
        raise ValueError("deepseek_v3 (MLA) is supported at tensor parallel 1 only")
    if not getattr(hf_config, "rope_interleave", True):
        raise ValueError("deepseek_v3 with rope_interleave=False: Megatron's MLA rotary reads interleaved dims")
    return dict(
        q_lora_rank=mla.q_lora_rank or None,
        kv_lora_rank=mla.kv_lora_rank,
        qk_head_dim=mla.qk_nope_head_dim,
        qk_pos_emb_head_dim=mla.qk_rope_head_dim,
        v_head_dim=mla.v_head_dim,
        rope_type="rope",
        rotary_base=_rope_parameters(hf_config)["rope_theta"],
        rotary_scaling_factor=1.0,
    )


def _rope_parameters(hf_config) -> dict:
    return getattr(hf_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": hf_config.rope_theta}


def rope_inv_freq(hf_config) -> Tensor:
    """HF's inverse RoPE frequencies (default, linear and llama3 scaling) for Megatron to use as-is."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = _rope_parameters(hf_config)
    rope_type = params.get("rope_type", "default")
    if rope_type not in _SUPPORTED_ROPE:
        raise ValueError(f"rope_type {rope_type!r} not supported; expected one of {_SUPPORTED_ROPE}")
    shape = model_shape(hf_config)
    head_dim = shape.mla.qk_rope_head_dim if shape.mla else shape.head_dim  # MLA: only its rotary part turns
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if rope_type == "default":
        dims = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        return 1.0 / (params["rope_theta"] ** dims)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    assert scaling == 1.0, "supported RoPE types do not rescale attention"
    return inv_freq.float()


def layer_spec(config: TransformerConfig) -> ModuleSpec | TransformerBlockSubmodules:
    """Megatron's local (no Transformer Engine) layer spec with SDPA as core attention; per layer
    where dense and MoE layers mix (`moe_layer_freq`)."""
    if isinstance(config.moe_layer_freq, list):
        block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
        specs = block.layer_specs
    else:
        block = spec = get_gpt_layer_local_spec(
            num_experts=config.num_moe_experts, moe_grouped_gemm=False, qk_layernorm=config.qk_layernorm,
            multi_latent_attention=config.multi_latent_attention, normalization="RMSNorm",
        )  # fmt: skip
        specs = [spec]
    for spec in specs:
        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return block


def build_gpt_model(
    hf_config,
    *,
    params_dtype: torch.dtype = torch.float32,
    use_gpu: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    expert_parallel: int = 1,
) -> GPTModel:
    """An uninitialised GPTModel with the HF model's architecture (load weights with `convert`)."""
    config = transformer_config(
        hf_config,
        params_dtype=params_dtype,
        use_gpu=use_gpu,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        expert_parallel=expert_parallel,
    )
    shape = model_shape(hf_config, tensor_parallel)
    from megatron.core import parallel_state

    with _mla_buildable(shape.mla is not None, use_gpu):
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(config),
            vocab_size=shape.padded_vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=shape.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_percent=_rope_parameters(hf_config).get("partial_rotary_factor", 1.0),
            parallel_output=False,  # gather the vocab dimension: log-probs need the full softmax
        )
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
    for rotary in _rotary_embeddings(model):
        _keep_rotary_on_host(rotary, rope_inv_freq(hf_config), device, use_gpu)
    for router in moe_routers(model):
        router.__class__ = HostTopKRouter  # instance-local, as the rotary embedding's
        if shape.expert_bias:
            _attach_expert_bias(router, shape.num_experts)
    if expert_parallel > 1:
        from slimeish.trainer.expert_parallel import mark_expert_parallel

        mark_expert_parallel(model, use_gpu)
    return model.to(device)


def moe_routers(model: torch.nn.Module) -> list[TopKRouter]:
    """Each MoE layer's router, in layer order (dense layers have none)."""
    layers = model.decoder.layers  # type: ignore[union-attr]
    return [layer.mlp.router for layer in layers if hasattr(layer.mlp, "router")]  # type: ignore[union-attr]


def _attach_expert_bias(router: TopKRouter, num_experts: int) -> None:
    """GLM-4.5's score-correction bias as the router's `expert_bias` buffer, which Megatron's
    top-k adds to the scores before choosing (and not to the weights). Held fixed: Megatron's
    own (`moe_router_enable_expert_bias`) is built on `torch.cuda.current_device()`, which a CPU
    host lacks, and updates it from each step's expert loads, which RL of a released model has no
    use for; the trainer then keeps the checkpoint's bias and the engine's routing agrees."""
    del router.expert_bias  # Megatron's None attribute, so the name can be a buffer
    router.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32))


@contextmanager
def _mla_buildable(mla: bool, use_gpu: bool) -> Iterator[None]:
    """While MLA layers are built, two names in megatron-core 0.16.1's `multi_latent_attention`
    module say the truth, and are restored after the build:
    - `HAVE_TE`: it imports Megatron's TE extension, which imports without Transformer Engine
      (a MagicMock `te`), so it believes TE present and `isinstance(linear_proj, TELinear)` fails
      on the mock; it is set to whether `transformer_engine` is installed.
    - on a CPU host, `RotaryEmbedding` as `HostRotaryEmbedding` made on the CPU: MLA builds its
      rotary embedding without `use_cpu_initialization`, which calls `torch.cuda.current_device()`.
    """
    if not mla:
        yield
        return
    from megatron.core.transformer import multi_latent_attention as module

    swapped: dict[str, object] = {"HAVE_TE": importlib.util.find_spec("transformer_engine") is not None}
    if not use_gpu:
        swapped["RotaryEmbedding"] = partial(HostRotaryEmbedding, use_cpu_initialization=True)
    built = {name: getattr(module, name) for name in swapped}
    for name, value in swapped.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in built.items():
            setattr(module, name, value)


def _rotary_embeddings(model: GPTModel) -> list[RotaryEmbedding]:
    """The model's rotary embedding, or each MLA layer's own (MLA models have no shared one)."""
    if not model.config.multi_latent_attention:
        return [model.rotary_pos_emb]
    return [layer.self_attention.rotary_pos_emb for layer in model.decoder.layers]


def _keep_rotary_on_host(rotary: RotaryEmbedding, inv_freq: Tensor, device: torch.device, use_gpu: bool) -> None:
    if not use_gpu:
        rotary.__class__ = HostRotaryEmbedding  # instance-local; see HostRotaryEmbedding's docstring
    rotary.inv_freq = inv_freq.to(device)


def gpt_logits(model: GPTModel, input_ids: Tensor, vocab_size: int) -> Tensor:
    """Logits [b, s, vocab_size] in the model's dtype (Megatron's padded vocab rows cut off)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    logits = model(input_ids=input_ids, position_ids=positions, attention_mask=None)
    return logits[..., :vocab_size]
