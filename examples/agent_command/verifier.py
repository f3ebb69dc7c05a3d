"""Score an `agent.py --answer-only` run: its stdout on stdin, the label in `SLIMEISH_LABEL`.

`slimeish.rollout_functions.agent_command` runs this (`--verifier-command`) when the agent's last stdout
line is not a reward. It prints `{"reward": x}` with the agent's own scoring rule, so the two
ways of running the example train on the same reward.
"""

from __future__ import annotations

import json
import os
import sys

from agent import score  # the script's own folder is on sys.path when run as a file


def main() -> None:
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    answer = json.loads(lines[-1]).get("answer") if lines else None
    print(json.dumps({"reward": score(answer, json.loads(os.environ.get("SLIMEISH_LABEL", "null")))}))


if __name__ == "__main__":
    main()
