"""Shared fixtures: tiny models built once per test session, in Hugging Face format."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimeish.models.tiny import TinyModelConfig, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build (once per arch and family) and return the directory of a tiny model: `factory("qwen3")`,
    `factory(family="qwen3")` (Qwen3's chat template and renderer)."""
    built: dict[tuple, Path] = {}

    def factory(arch: str | None = "qwen2", family: str = "chatml") -> Path:
        key = (arch, family) if family == "chatml" or arch == "qwen3_moe" else (None, family)
        if key not in built:
            cfg = TinyModelConfig(arch=key[0], family=family)  # type: ignore[arg-type]  # tests pass names
            built[key] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}-{family}"), cfg)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_model(tiny_model_factory) -> Path:
    """The default tiny Qwen2 model directory."""
    return tiny_model_factory("qwen2")
