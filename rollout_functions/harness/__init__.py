"""Harness episodes: a Harbor task, an unmodified agent program, a sandbox, a reward from the tests.

`--rollout-function-path slimeish.rollout_functions.harness.generate_rollout` (docs/harness.md).
Modules: `tasks` (the task format, prompt data), `sandbox` (the provider interface), `local` (the
local provider, bubblewrap), `episode` (one episode and its typed outcome), `rollout` (the rollout
function and its flags).
"""

from slimeish.rollout_functions.harness.rollout import ROLLOUT_CONFIG, generate_rollout

__all__ = ["ROLLOUT_CONFIG", "generate_rollout"]
