"""Built-in rollout functions and reward functions, picked by import path."""
