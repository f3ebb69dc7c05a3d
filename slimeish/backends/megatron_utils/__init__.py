"""slime's `slime.backends.megatron_utils`: the helpers its custom loss and TIS functions import."""
