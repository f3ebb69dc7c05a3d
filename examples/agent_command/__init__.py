"""An external agent program trained through `rollout_functions.agent_command`."""
