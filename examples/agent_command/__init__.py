"""An external agent program trained through `slimeish.rollout_functions.agent_command`."""
