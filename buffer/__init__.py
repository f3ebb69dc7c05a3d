"""The Redis data buffer: sessions, turns, samples and GRPO groups, durable across crashes."""
