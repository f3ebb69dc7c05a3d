"""The Megatron-core trainer: model bridge, RL losses, checkpoints and weight sync."""
