#!/bin/bash
# mini-swe-agent (PyPI `mini-swe-agent`, `pip install 'slimeish[harness]'`) as a harness agent program:
# its default `mini.yaml` config, pointed at the episode's router session through litellm's
# OpenAI provider, non-interactive, with the step and token limits given as arguments:
#   --agent-command 'MINI=/path/to/venv/bin/mini bash examples/coding_tasks/mini_swe_agent.sh STEPS MAX_TOKENS'
set -euo pipefail
steps=${1:-4}
max_tokens=${2:-256}
# no first-run wizard, no cost-map download or pricing of an unknown model, no retries (a failed call is the episode's)
export MSWEA_SILENT_STARTUP=1 MSWEA_CONFIGURED=true LITELLM_LOCAL_MODEL_COST_MAP=True
export MSWEA_COST_TRACKING=ignore_errors MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1
exec "${MINI:-mini}" --yolo --exit-immediately --model openai/policy --task "$SLIMEISH_INSTRUCTION" \
    -c mini.yaml -c "agent.step_limit=$steps" -c "model.model_kwargs.max_tokens=$max_tokens" \
    -c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -o "$TMPDIR/trajectory.json" </dev/null
