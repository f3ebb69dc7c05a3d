"""slime's SFT example launch line (scripts/run-qwen3-4B-base-sft.sh at slime 624b824: its MODEL_ARGS from
scripts/models/qwen3-4B.sh and every flag it passes to train_async.py) accepted as written, with slime's meaning."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slimeish.data import DataConfig, read_prompts
from slimeish.train.model_args import check_model_args
from slimeish.train.setup import parse_args

MODEL_ARGS = """
--swiglu --num-layers 36 --hidden-size 2560 --ffn-hidden-size 9728 --num-attention-heads 32 --group-query-attention
--num-query-groups 8 --use-rotary-position-embeddings --disable-bias-linear --normalization RMSNorm
--norm-epsilon 1e-6 --rotary-base 1000000 --vocab-size 151936 --kv-channels 128 --qk-layernorm
"""
SFT_LINE = """
--actor-num-nodes 1 --actor-num-gpus-per-node 8 {model_args}
--hf-checkpoint {model} --ref-load {model}_torch_dist --load {ckpt} --save {ckpt} --save-interval 1000
--rollout-function-path slimeish.rollout.sft_rollout.generate_rollout --prompt-data {data} --input-key messages
--rollout-shuffle --num-epoch 3 --rollout-batch-size 128 --global-batch-size 128
--loss-type sft_loss --calculate-per-token-loss --disable-compute-advantages-and-returns --debug-train-only
--optimizer adam --lr 1e-5 --lr-decay-style cosine --min-lr 1e-6 --lr-warmup-fraction 0.1 --weight-decay 0.1
--adam-beta1 0.9 --adam-beta2 0.95
--tensor-model-parallel-size 1 --sequence-parallel --pipeline-model-parallel-size 1 --context-parallel-size 1
--expert-model-parallel-size 1 --expert-tensor-parallel-size 1 --recompute-granularity full --recompute-method uniform
--recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu 9216
--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
--attention-backend flash
"""
CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _parquet(path: Path, rows: int) -> Path:
    pq.write_table(pa.Table.from_pylist([{"messages": CONVERSATION, "id": i} for i in range(rows)]), path)
    return path


def _line(tmp_path: Path, model_args: str = MODEL_ARGS) -> list[str]:
    data = _parquet(tmp_path / "openhermes2_5.parquet", 256)
    return SFT_LINE.format(model_args=model_args, model=tmp_path / "m", ckpt=tmp_path / "ckpt", data=data).split()


def test_slimes_sft_line_parses_with_slimes_meaning(tmp_path, capsys):
    setup = parse_args(_line(tmp_path))
    assert setup.loss.loss_type == "sft_loss" and not setup.loss.compute_advantages
    assert setup.loss.loss_aggregation == "token"  # --calculate-per-token-loss
    assert setup.data.shuffle and setup.rollout.rollout_batch_size == 128 and setup.trainer.global_batch_size == 128
    # --num-epoch 3 over 256 prompts of 128 per rollout; SFT groups are one conversation (slime's default
    # --n-samples-per-prompt), so one optimizer step of 128 a rollout.
    assert setup.rollout.n_samples_per_prompt == 1
    assert setup.run.num_rollout == 6
    t = setup.trainer
    assert (t.lr, t.min_lr, t.lr_decay_style, t.weight_decay, t.adam_beta2) == (1e-5, 1e-6, "cosine", 0.1, 0.95)
    assert (t.lr_warmup_steps, t.lr_decay_steps) == (0, 6)  # int(10% of the run's 6 steps) warm up, the rest decay
    assert t.micro_batch_tokens == 9216
    assert setup.run.checkpoints == tmp_path / "ckpt"  # --save
    assert setup.run.checkpoint_to_load() is None  # --load = --save, nothing saved yet: slime starts fresh
    assert "num_layers=36" in setup.slime.model_arg and "qk_layernorm=true" in setup.slime.model_arg
    assert "--actor-num-nodes (slime) accepted" in capsys.readouterr().err


def test_the_load_folder_resumes_from_its_latest_checkpoint(tmp_path):
    setup = parse_args(_line(tmp_path))
    (tmp_path / "ckpt" / "step_000002").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest").symlink_to("step_000002")
    assert setup.run.checkpoint_to_load() == tmp_path / "ckpt" / "latest"


def test_model_args_are_checked_against_the_checkpoint(tiny_model_factory):
    model = tiny_model_factory("qwen3")
    config = json.loads((model / "config.json").read_text())
    theta = config["rope_parameters"]["rope_theta"]
    own = [f"num_layers={config['num_hidden_layers']}", f"hidden_size={config['hidden_size']}", "qk_layernorm=true",
           "swiglu=true", "normalization=RMSNorm", f"rotary_base={theta}"]  # fmt: skip
    check_model_args(own, model)
    qwen3_4b = parse_args(_line(model.parent)).slime.model_arg
    with pytest.raises(ValueError, match=rf"--num-layers 36 \(the checkpoint: {config['num_hidden_layers']}\)"):
        check_model_args(qwen3_4b, model)
    with pytest.raises(ValueError, match="--qk-layernorm true"):
        check_model_args(["qk_layernorm=true"], tiny_model_factory("qwen2"))


def test_parquet_prompts_are_read_as_slime_reads_them(tmp_path):
    data = _parquet(tmp_path / "p.parquet", 3)
    samples = read_prompts(data, DataConfig(prompt_data=data, input_key="messages"))
    assert [s.prompt for s in samples] == [CONVERSATION] * 3
