"""slime-signature hook plugins that `slimeish train` runs in a subprocess (test_slime_hooks_e2e)."""

import json
from pathlib import Path

from slimeish.rollout import RolloutFnEvalOutput
from slimeish.rollout_functions.token_in import generate_rollout


def eval_with_tag(args, rollout_id, data_source, evaluation=False):
    """Evaluates with the default rollout, adding a metric named by the custom config's key."""
    out = generate_rollout(args, rollout_id, data_source, evaluation=True)
    return RolloutFnEvalOutput(data=out.data, metrics={args.eval_tag: float(rollout_id)})


def drop_index_one(args, samples):
    for group in samples:
        for sample in group:
            sample.remove_sample = sample.index == 1


def record_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    trained = [sum(s.loss_mask) for s in samples if s.index == 1]
    line = {"rollout_id": rollout_id, "samples": len(samples), "removed_tokens": trained}
    with (Path(args.run_dir) / "hook_log.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    return False
