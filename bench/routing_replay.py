"""Routing replay (R3) on vs off, on a tiny MoE model (Qwen3-MoE by default) with its engine's routers perturbed.

The engine's router weights get Gaussian noise of `scale` x their mean magnitude (what a
different kernel's rounding does to the router logits, exaggerated); the engine runs 16
teacher-forced sequences and records their log-probs and routes; the trainer (unperturbed
weights) computes the same tokens' log-probs with replay off and on. Prints, per scale, the
fraction of (token, layer) pairs routed differently from the engine in the trainer's forward and
the |trainer - engine| log-prob gap over the response tokens.

    python -m bench.routing_replay --scales 0.1 0.5 1.0 [--arch glm4_moe|deepseek_v3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from slimeish.models.tiny import TinyModelConfig, make_tiny_model
from slimeish.trainer.config import LossConfig, TrainerConfig
from slimeish.trainer.trainer import Trainer
from tests.trainer.test_routing_replay import FAMILY, engine_samples, gap, perturbed_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--arch", choices=list(FAMILY), default="qwen3_moe", help="the tiny model's architecture")
    args = parser.parse_args()
    tiny = TinyModelConfig(arch=args.arch, family=FAMILY[args.arch])
    model = make_tiny_model(Path(tempfile.mkdtemp()) / "moe", tiny)
    trainers = {r: Trainer(TrainerConfig(model_path=model, use_rollout_routing_replay=r), LossConfig()) for r in (0, 1)}
    print("| router noise | R3 | routing mismatch | trainer's own top-k differs | mean abs dlogp | max abs dlogp |")
    print("|---|---|---|---|---|---|")
    for scale in args.scales:
        samples = engine_samples(perturbed_engine(model, scale), args.samples, seed=11)
        for replay, trainer in trainers.items():
            max_gap, mean_gap = gap(trainer, samples)
            m = trainer.routing.take_mismatch()  # type: ignore[union-attr]  # an MoE model has its routing
            print(f"| {scale} | {'on' if replay else 'off'} | {m['routing_mismatch']:.3f} | "
                  f"{m['routing_mismatch_own']:.3f} | {mean_gap:.2e} | {max_gap:.2e} |")  # fmt: skip


if __name__ == "__main__":
    main()
