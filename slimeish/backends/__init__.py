"""slime's `slime.backends` import paths for what its loss plugins use (`megatron_utils.loss`, `.cp_utils`)."""
