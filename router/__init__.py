"""The token-logging router: OpenAI-compatible sessions in front of SGLang-protocol engines."""
