"""The GPU check's Python stages, one per process (Megatron's parallel state is process-global).

    python -m bench.gpu_check train  --device cuda --out DIR   # dense tiny model, bf16 steps
    python -m bench.gpu_check parity --device cuda --out DIR   # engine vs trainer log-probs
    python -m bench.gpu_check nccl   --device cuda --out DIR   # weight broadcast, two processes
    python -m bench.gpu_check moe    --device cuda --out DIR   # tiny Qwen3-MoE, bf16 steps

Each stage writes DIR/<stage>.json ({"status": "PASS"|"FAIL"|"SKIP", ...numbers}) and prints one
PASS/FAIL line. `--device cpu` runs the same code in fp32 over gloo: the CPU dry run of
bench/gpu_check.sh uses it so the stages' own logic is checked before a GPU is ever lent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from slimeish.common.sample import Sample
from slimeish.models.tiny import TinyModelConfig, make_tiny_model

# fp32 on either device: the bound the CPU tests hold engine and trainer to (TF32 is off by default).
PARITY_FP32_BOUND = 1e-4
NCCL_COVERS = (
    "torch.distributed broadcast of the HF weights between two processes; the SGLang HTTP side of "
    "slimeish/trainer/nccl_broadcast.py needs sglang (not on the GPU machine) and is not run"
)


def _tiny(arch: str = "qwen3") -> Path:
    return make_tiny_model(Path(tempfile.mkdtemp(prefix=f"gpu-check-{arch}-")), TinyModelConfig(arch=arch))


def _tiny_qwen3_moe() -> Path:
    """A tiny Qwen3-MoE checkpoint (4 experts, top 2) in HF's per-expert layout; the trainer needs no tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    out = Path(tempfile.mkdtemp(prefix="gpu-check-qwen3-moe-"))
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    return out


def _finite(metrics: dict[str, float]) -> bool:
    return all(v == v and abs(v) != float("inf") for v in metrics.values())


def stage_train(device: str) -> dict:
    return _train(device, _tiny())


def stage_moe(device: str) -> dict:
    return _train(device, _tiny_qwen3_moe())


def _train(device: str, model_dir: Path, steps: int = 5) -> dict:
    """A few GRPO steps on a fixed batch: the rewarded answers must gain log-prob over the others."""
    from slimeish.trainer.config import LossConfig, TrainerConfig
    from slimeish.trainer.trainer import Trainer

    dtype = "bfloat16" if device == "cuda" else "float32"
    trainer = Trainer(TrainerConfig(model_path=model_dir, device=device, dtype=dtype, lr=1e-3), LossConfig())
    gen = torch.Generator().manual_seed(0)
    samples = []
    for g in range(4):
        prompt = torch.randint(0, trainer.shape.vocab_size, (8,), generator=gen).tolist()
        for i in range(4):
            answer = torch.randint(0, trainer.shape.vocab_size, (16,), generator=gen).tolist()
            samples.append(Sample(group_index=g, index=i, tokens=prompt + answer, response_length=16,
                                  loss_mask=[1] * 16, reward=float(i % 2)))  # fmt: skip

    def margin() -> float:  # mean log-prob of rewarded answers minus that of the others
        lp = [sum(x) / len(x) for x in trainer.compute_log_probs(samples)]
        return sum(lp[1::2]) / len(lp[1::2]) - sum(lp[0::2]) / len(lp[0::2])

    before, history, t0 = margin(), [], time.perf_counter()
    for _ in range(steps):
        history.append(trainer.train_step(samples))
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    after = margin()
    ok = all(_finite(m) for m in history) and trainer.weight_version == steps and after > before
    return {"status": "PASS" if ok else "FAIL", "dtype": dtype, "steps": steps, "margin_before": before,
            "margin_after": after, "seconds_per_step": seconds / steps, "loss": [m.get("loss") for m in history],
            "grad_norm": [m.get("grad_norm") for m in history],
            "peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0}  # fmt: skip


def _engine_samples(model_dir: Path, device: str, dtype: str) -> tuple[list[Sample], int]:
    """Sample with the embedded engine's scheduler in-process; keep its per-token log-probs.

    Also returns how many prompt tokens came from the prefix cache (the last prompt shares 8 with
    one that finished before it was admitted)."""
    from slimeish.engine.model_runner import ModelRunner
    from slimeish.engine.protocol import SamplingParams, SequenceRequest
    from slimeish.engine.scheduler import Scheduler, SchedulerConfig

    runner = ModelRunner(str(model_dir), device=device, dtype=dtype, context_length=256)
    # Small pages and prefill chunks, and prompts sharing a prefix, so the paged KV cache's chunk
    # boundaries and prefix hits are on the path whose log-probs the trainer checks.
    cfg = SchedulerConfig(max_rows=4, max_prefill_tokens=64, chunk_size=8, total_tokens=4096, page_size=4)
    sched = Scheduler(runner, cfg, weight_version=0)
    finished: list = []
    prompts = [[5, 6, 7], [9] * 11, [3, 1, 4, 1, 5], [2, 7], [8, 8, 8, 8], [11, 12], [9] * 11 + [3, 4]]
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)
        req = SequenceRequest(f"r{i}", i, prompt, params, seed=i, return_logprob=True, return_text_in_logprobs=False)
        req.max_new_tokens = 24
        sched.submit(req, lambda s: s.finished and finished.append(s))
    while not sched.idle:
        sched.step()
    samples = [
        Sample(group_index=i, index=0, tokens=s.req.input_ids + s.output_ids, response_length=len(s.output_ids),
               loss_mask=[1] * len(s.output_ids), rollout_log_probs=list(s.logprobs), reward=0.0)
        for i, s in enumerate(finished)
    ]  # fmt: skip
    return samples, sum(s.cached_tokens for s in finished)


def _max_gap(trainer, samples: list[Sample]) -> float:
    ours = trainer.compute_log_probs(samples)
    return max(
        (torch.tensor(a) - torch.tensor(s.rollout_log_probs)).abs().max().item()
        for a, s in zip(ours, samples, strict=True)
    )


def stage_parity(device: str) -> dict:
    """The engine's sampled log-probs against the trainer's recomputation, fp32 (bounded) and bf16 (reported)."""
    from slimeish.trainer.config import LossConfig, TrainerConfig
    from slimeish.trainer.trainer import Trainer

    model_dir = _tiny()
    samples, cached = _engine_samples(model_dir, device, "float32")
    trainer = Trainer(TrainerConfig(model_path=model_dir, device=device, dtype="float32"), LossConfig())
    gap32 = _max_gap(trainer, samples)
    result: dict = {"tokens": sum(s.response_length for s in samples), "fp32_max_abs_gap": gap32,
                    "fp32_bound": PARITY_FP32_BOUND, "cached_tokens": cached}  # fmt: skip
    result["status"] = "PASS" if gap32 <= PARITY_FP32_BOUND and cached > 0 else "FAIL"
    if device == "cuda":
        # bf16 on both sides: rounding differs between the two implementations, so the gap is only
        # reported; an error is still a failure, recorded beside the fp32 numbers already measured.
        try:
            bf16_samples, _ = _engine_samples(model_dir, device, "bfloat16")
            bf16 = Trainer(TrainerConfig(model_path=model_dir, device=device, dtype="bfloat16"), LossConfig())
            result["bf16_max_abs_gap"] = _max_gap(bf16, bf16_samples)
        except Exception as e:
            result["status"], result["reason"] = "FAIL", f"bf16: {type(e).__name__}: {e}"[:800]
    return result


def _nccl_worker(rank: int, model_dir: str, port: int, device: str, queue) -> None:
    """Rank 0 (the trainer) broadcasts every HF tensor; rank 1 (an engine) receives into fresh buffers."""
    from slimeish.trainer.hf_io import read_hf_weights

    backend = "nccl" if device == "cuda" else "gloo"
    gpu = rank % max(1, torch.cuda.device_count()) if device == "cuda" else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu) if gpu is not None else torch.device("cpu")
    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                         timeout=timedelta(seconds=45))  # fmt: skip
    try:
        weights = read_hf_weights(model_dir)
        torch.distributed.barrier()
        t0 = time.perf_counter()
        exact = True
        for name in sorted(weights):
            ref = weights[name].to(dev)
            buf = ref.clone() if rank == 0 else torch.empty_like(ref)
            torch.distributed.broadcast(buf, src=0)
            exact &= bool(torch.equal(buf, ref))
        if gpu is not None:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        nbytes = sum(t.nbytes for t in weights.values())
        queue.put({"rank": rank, "exact": exact, "seconds": seconds, "bytes": nbytes, "tensors": len(weights)})
    except Exception as e:  # reported by the parent: the NCCL error text is the finding
        queue.put({"rank": rank, "error": f"{type(e).__name__}: {e}"[:800]})
    finally:
        torch.distributed.destroy_process_group()


def stage_nccl(device: str) -> dict:
    """Two processes, one process group, the tiny model's weights broadcast from rank 0 and compared bitwise.

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so with one GPU the attempt is
    made, its error recorded, and the stage is a SKIP rather than a PASS."""
    import torch.multiprocessing as mp

    from slimeish.common.procs import free_port

    gpus = torch.cuda.device_count() if device == "cuda" else 0
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    model_dir, port = str(_tiny()), free_port()
    # Daemonic, and terminated if still alive: a rank left stuck in a failed NCCL group must not
    # hold this process at exit (multiprocessing joins non-daemonic children) past the stage's limit.
    procs = [ctx.Process(target=_nccl_worker, args=(r, model_dir, port, device, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    replies = sorted((queue.get(timeout=70) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=20)
        if p.is_alive():
            p.terminate()
    result: dict = {"backend": "nccl" if device == "cuda" else "gloo", "gpus": gpus, "ranks": replies,
                    "covers": NCCL_COVERS}  # fmt: skip
    errors = [r["error"] for r in replies if "error" in r]
    if errors:
        # NCCL words it "invalid usage ... Duplicate GPU detected : rank 1 and rank 0 both on CUDA device"
        single = device == "cuda" and gpus < 2 and any("Duplicate GPU" in e or "nvalid usage" in e for e in errors)
        result["status"] = "SKIP" if single else "FAIL"
        result["reason"] = "one GPU: NCCL refuses two ranks on one device" if single else errors[0]
        return result
    result["status"] = "PASS" if all(r["exact"] for r in replies) else "FAIL"
    result["gb_per_s"] = replies[0]["bytes"] / max(replies[0]["seconds"], 1e-9) / 1e9
    return result


STAGES = {"train": stage_train, "parity": stage_parity, "nccl": stage_nccl, "moe": stage_moe}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{args.stage}: FAIL: CUDA is not available (torch {torch.__version__})")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    t0 = time.perf_counter()
    result = {"stage": args.stage, "device": args.device, **STAGES[args.stage](args.device)}
    result["seconds"] = round(time.perf_counter() - t0, 2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stage}.json").write_text(json.dumps(result, indent=1))
    numbers = {k: v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    print(
        f"{args.stage}: {result['status']} {json.dumps(numbers)}"
        + (f" ({result['reason']})" if "reason" in result else "")
    )
    sys.exit(0 if result["status"] in ("PASS", "SKIP") else 1)


if __name__ == "__main__":
    main()
