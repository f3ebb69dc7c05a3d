"""verifiers environments run unmodified: their own loop, tools, parser and rubric.

    python -m slimeish.rollout_functions.verifiers_env DATA --env-id my_env
    slimeish train --rollout-function-path slimeish.rollout_functions.verifiers_env --env-id my_env \\
        [--env-args '{"...": ...}'] [--env-session-form header] --prompt-data DATA/train.jsonl ...

`--env-id` names an installed verifiers environment (its module's `load_environment(**env_args)`,
what `vf.load_environment` imports: `vf-install`ed packages, or any importable module path). The
prompts are the environment's dataset rows (`prompt`, and `answer`/`info`/`task`/`example_id` in
the label). An episode is the environment's `run_rollout` on one row with a verifiers client whose
OpenAI base URL is the member's session (`path`), or the router's one shared `/v1` with the
session's key in `X-Session-ID` (`header`); the reward is the rubric's, its metrics the sample's
`scores`. This is verifiers' classic `Environment` API (`verifiers.legacy`, also `import
verifiers as vf`), which verifiers 0.3.1 ships; its v1 taskset x harness stack is not driven.
"""

from __future__ import annotations

import functools
import json
import signal
from dataclasses import dataclass
from typing import Any, Literal
from unittest import mock

from slimeish.common.config import help_field
from slimeish.common.sample import Sample
from slimeish.rollout import RolloutFnEvalOutput, RolloutFnTrainOutput
from slimeish.rollout_functions.environments import (
    EnvAdapter,
    EnvConfig,
    EpisodeContext,
    Outcome,
    prompts_main,
    run_env,
)
from slimeish.rollout_functions.sessions import Session

# a row's fields besides its prompt that verifiers' rollout input carries
ROW_FIELDS = ("answer", "info", "task", "example_id")


@dataclass(kw_only=True)
class VerifiersConfig(EnvConfig):
    package = "verifiers"
    extra = "verifiers"
    env_session_form: Literal["path", "header"] = help_field(
        "path",
        help="how the environment's client names its session: `path` (base URL /s/<key>/v1) or `header` "
        "(one shared /v1 base URL, the key in X-Session-ID)",
    )


ROLLOUT_CONFIG = VerifiersConfig


class Verifiers(EnvAdapter):
    def __init__(self, env_id: str, env_args: dict[str, Any]) -> None:
        super().__init__(env_id, env_args)
        self.vf = VerifiersConfig.load()

    @functools.cached_property
    def env(self) -> Any:
        # A verifiers Environment installs SIGINT/SIGTERM handlers when built (its teardown, then
        # exit), which fails outside the main thread (slimeish train's producer runs rollouts in
        # its own) and would replace the handlers with which slimeish stops its processes. The
        # process's signals stay slimeish's; the environment's teardown still runs at exit (atexit).
        with mock.patch.object(signal, "signal", lambda signum, handler: None):
            return self.vf.load_environment(self.env_id, **self.env_args)

    def records(self, n: int, seed: int, split: str) -> list[dict[str, Any]]:
        rows = self.env.get_eval_dataset(n, seed) if split == "eval" else self.env.get_dataset(n, seed)
        return [
            {"prompt": row["prompt"], "label": json.loads(json.dumps({k: row[k] for k in ROW_FIELDS if k in row}))}
            for row in rows
        ]

    async def run(self, session: Session, sample: Sample, ctx: EpisodeContext) -> Outcome:
        from verifiers.clients import OpenAIChatCompletionsClient
        from verifiers.types import ClientConfig

        if getattr(ctx.args, "env_session_form", "path") == "header":
            config = ClientConfig(
                api_base_url=f"{session.router_url.rstrip('/')}/v1", extra_headers={"X-Session-ID": session.api_key},
                max_retries=0,  # a retried turn would be captured twice
            )  # fmt: skip
            client = OpenAIChatCompletionsClient(config)
        else:
            client = OpenAIChatCompletionsClient(self.client(session))
        try:
            # sampling is the session's (the rollout's defaults) unless the environment sets its own
            out = await self.env.run_rollout({"prompt": sample.prompt, **sample.label}, client, "policy", {})
        finally:
            if client.config is not None:  # a client verifiers built for itself: its HTTP pool is its own
                await client.close()
        if out.get("error"):
            raise RuntimeError(f"the verifiers environment failed: {out['error']}")
        sample.response = json.dumps(out.get("completion"), default=lambda m: m.model_dump(exclude_none=True))
        return Outcome(float(out["reward"]), {k: float(v) for k, v in (out.get("metrics") or {}).items()})


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    return run_env(Verifiers, args, rollout_id, data_source, evaluation)


if __name__ == "__main__":
    prompts_main(Verifiers)
