"""slime's `slime.backends.megatron_utils.loss` helpers for custom losses (`--custom-loss-function-path`):
`get_log_probs_and_entropy` on the packed logits the hook receives (temperature 1, as the trainer's
own log-probs; no top-p replay). slimeish.trainer.loss_hooks documents the layout."""

from slimeish.trainer.loss_hooks import get_log_probs_and_entropy

__all__ = ["get_log_probs_and_entropy"]
