"""A reference rollout function that declares a flag of its own (the `ROLLOUT_CONFIG` contract)."""

from dataclasses import dataclass

from slimeish.common.config import help_field
from slimeish.common.sample import Status
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput


@dataclass(kw_only=True)
class EchoConfig:
    echo_prefix: str = help_field("echo", help="what every response starts with")

    def check(self) -> None:
        if not self.echo_prefix:
            raise ValueError("--echo-prefix must not be empty")


ROLLOUT_CONFIG = EchoConfig


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(args.rollout_batch_size)
    for sample in (s for g in groups for s in g):
        sample.response, sample.reward, sample.status = f"{args.echo_prefix} {sample.prompt}", 1.0, Status.COMPLETED
    if evaluation:
        return RolloutFnEvalOutput(data={"eval": {"rewards": [s.reward for g in groups for s in g]}})
    return RolloutFnTrainOutput(samples=groups)
