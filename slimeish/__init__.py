"""slimeish: reinforcement learning for LLM agents through an OpenAI-compatible token-logging router."""

__version__ = "0.1.0"
