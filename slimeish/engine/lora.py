"""LoRA adapters served unmerged: each request names one (SGLang's `lora_path`) or none (the base).

An adapter is a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`, as
`Trainer.export_peft` and `PeftModel.save_pretrained` write it). Its A and B stay apart from the
base weights: a forward hook on each adapted `nn.Linear` adds `scale * (x @ A^T) @ B^T` to the
rows whose sequence uses that adapter, so one batch mixes the base model and several adapters,
and loading or swapping an adapter never touches the base weights. A Mixture-of-Experts layer's
routed experts are 3-D parameters of one module (PEFT's `target_parameters`,
slimeish.common.peft_experts): the experts module's forward runs the rows that use an adapter
through `moe.experts_with_lora`, each expert's delta added inside its MLP, and the others as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from slimeish.common import peft_experts
from slimeish.engine.moe import ExpertLora, experts_with_lora

_PREFIX = "base_model.model."  # PEFT's keys name modules under its wrapper


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    scale: float
    modules: dict[str, tuple[Tensor, Tensor]]  # HF module name -> (A [r, in], B [out, r])
    experts: dict[str, ExpertLora]  # HF experts module name -> its fused parameters' per-expert (A, B)


def read_peft_adapter(name: str, path: str, model: nn.Module) -> LoraAdapter:
    """Read and check a PEFT LoRA directory against `model`; ValueError says what does not fit."""
    root = Path(path)
    cfg_file, weights_file = root / "adapter_config.json", root / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights_file.is_file():
        raise ValueError(f"{path!r} is not a PEFT adapter directory (adapter_config.json, adapter_model.safetensors)")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora") or cfg.get("bias", "none") != "none":
        raise ValueError(f"{path}: only plain LoRA adapters are served (no DoRA, no trained biases)")
    rank, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
    scale = alpha / (rank**0.5 if cfg.get("use_rslora") else rank)
    pairs: dict[str, dict[str, Tensor]] = {}
    for key, tensor in load_file(str(weights_file)).items():
        module, _, part = key.removeprefix(_PREFIX).rpartition(".lora_")
        pairs.setdefault(module, {})[part.removesuffix(".weight")] = tensor
    experts = _read_experts(path, pairs, peft_experts.targeted_params(cfg.get("target_parameters") or []), model, rank)
    modules = _read_linears(path, pairs, model, rank)
    if not modules and not experts:
        raise ValueError(f"{path}: the adapter holds no LoRA weights")
    return LoraAdapter(name, str(path), scale, modules, experts)


def _read_linears(
    path: str, pairs: dict[str, dict[str, Tensor]], model: nn.Module, rank: int
) -> dict[str, tuple[Tensor, Tensor]]:
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    modules = {}
    for module, ab in pairs.items():
        linear = linears.get(module)
        if linear is None or set(ab) != {"A", "B"}:
            raise ValueError(f"{path}: {module!r} is not a linear layer of the model, or lacks lora_A/lora_B")
        a, b = ab["A"], ab["B"]
        if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
            shapes = f"A {tuple(a.shape)} / B {tuple(b.shape)}"
            raise ValueError(f"{path}: {module} {shapes} do not fit r={rank} and the layer")
        weight = linear.weight
        modules[module] = (a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype))
    return modules


def _read_experts(
    path: str, pairs: dict[str, dict[str, Tensor]], targeted: list[str], model: nn.Module, rank: int
) -> dict[str, ExpertLora]:
    """The fused experts' adapters, taken out of `pairs` (PEFT's key paths for `targeted` parameters)."""
    found: dict[str, ExpertLora] = {}
    paths = peft_experts.key_paths(targeted)
    for name, module in model.named_modules():
        for param, rel in paths.items():
            ab = pairs.pop(".".join(filter(None, [name, rel])), None) if hasattr(module, param) else None
            if ab is None:
                continue
            fused = getattr(module, param)
            experts, out_features, in_features = fused.shape
            shapes = {k: tuple(t.shape) for k, t in ab.items()}
            if shapes != {"A": (experts * rank, in_features), "B": (out_features, rank * experts)}:
                raise ValueError(f"{path}: {name}.{param}'s lora_A/lora_B do not fit r={rank} and {experts} experts")
            a, b = peft_experts.from_peft(ab["A"], ab["B"], experts)
            found.setdefault(name, {})[param] = (a.to(fused.device, fused.dtype), b.to(fused.device, fused.dtype))
    return found


class LoraServing:
    """The loaded adapters and, during one forward, which adapter each batch row uses."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.adapters: dict[str, LoraAdapter] = {}  # the ones a new request may name
        # unloaded, but still used by requests that named them before: dropped once they finish
        self._retiring: dict[str, LoraAdapter] = {}
        # each adapter's weight version: its own, as several runs' adapters share the engine
        self.versions: dict[str, int] = {}
        self._hooked: set[str] = set()
        self._rows: list[str | None] = []

    def read(self, name: str, path: str) -> LoraAdapter:
        """Read adapter files (any thread); `install` makes them served."""
        return read_peft_adapter(name, path, self.model)

    def install(self, adapter: LoraAdapter, version: int | None) -> int:
        """Serve `adapter` (replacing one of its name: the next forward uses the new weights) at weight
        `version` (None: one more than its name's last, 0 for a new name); returns the version. Call
        it between forwards (the engine's event loop), as it may add hooks."""
        modules = dict(self.model.named_modules())
        for module in adapter.modules.keys() - self._hooked:
            modules[module].register_forward_hook(self._hook(module))
            self._hooked.add(module)
        for module in adapter.experts.keys() - self._hooked:
            experts = modules[module]
            experts.forward = self._experts_forward(module, experts, experts.forward)  # instance-local
            self._hooked.add(module)
        self.adapters[adapter.name] = adapter
        self.versions[adapter.name] = self.versions.get(adapter.name, -1) + 1 if version is None else version
        return self.versions[adapter.name]

    def retire(self, name: str) -> None:
        """The first half of an unload: no new request may name `name`; the requests already
        generating with it go on with it until `drop`."""
        if (adapter := self.adapters.pop(name, None)) is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded; loaded: {sorted(self.adapters)}")
        self._retiring[name] = adapter

    def drop(self, name: str) -> None:
        """The second half: once no request uses the retired adapter `name`, forget it."""
        del self._retiring[name], self.versions[name]

    @contextmanager
    def rows(self, adapters: list[str | None]) -> Iterator[None]:
        """Within the block, batch row i uses adapter `adapters[i]` (None: the base model)."""
        self._rows = adapters if any(a is not None for a in adapters) else []
        try:
            yield
        finally:
            self._rows = []

    @property
    def in_use(self) -> bool:
        """Whether a row of the running forward uses an adapter (then its modules' hooks must run)."""
        return bool(self._rows)

    def _adapter(self, name: str) -> LoraAdapter:
        return self.adapters.get(name) or self._retiring[name]

    def _experts_forward(self, module: str, experts: nn.Module, base_forward):
        """The experts module's forward: each adapter's rows (and the base rows) run apart, the
        adapter's delta inside every expert's MLP. The flattened tokens are the batch's rows in order."""

        def forward(x: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
            if not self._rows:
                return base_forward(x, top_k_index, top_k_weights)
            width = x.shape[0] // len(self._rows)
            out = torch.empty_like(x)
            for name in set(self._rows):
                lora = None if name is None else self._adapter(name)
                rows = [i for i, r in enumerate(self._rows) if r == name]
                tok = torch.tensor(rows, device=x.device)[:, None] * width + torch.arange(width, device=x.device)
                tok = tok.flatten()
                args = (x.index_select(0, tok), top_k_index.index_select(0, tok), top_k_weights.index_select(0, tok))
                if lora is None or module not in lora.experts:
                    out.index_copy_(0, tok, base_forward(*args))
                else:
                    out.index_copy_(0, tok, experts_with_lora(experts, *args, lora.experts[module], lora.scale))
            return out

        return forward

    def _hook(self, module: str):
        def add_lora(_: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> Tensor:
            if not self._rows:
                return out
            x = args[0]
            for name in set(self._rows) - {None}:
                assert name is not None
                adapter = self._adapter(name)
                pair = adapter.modules.get(module)
                if pair is None:
                    continue
                a, b = pair
                idx = torch.tensor([i for i, r in enumerate(self._rows) if r == name], device=x.device)
                out = out.index_add(0, idx, (x.index_select(0, idx) @ a.t()) @ b.t(), alpha=adapter.scale)
            return out

        return add_lora
