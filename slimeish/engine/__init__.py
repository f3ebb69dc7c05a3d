"""The embedded inference engine: a PyTorch server that speaks SGLang's native HTTP protocol."""
