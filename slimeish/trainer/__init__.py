"""The Megatron-core trainer: model bridge, RL losses, checkpoints and weight sync (docs/trainer.md).

Entry points: `trainer.Trainer`, `config.TrainerConfig` / `config.LossConfig`,
`weight_sync.WeightSync` / `weight_sync.WeightSyncConfig`. Importing this package does not
import Megatron; the submodules that build models do.
"""
