"""Shared fixtures: tiny models built once per test session, in Hugging Face format."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimeish.models.tiny import TinyModelConfig, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build (once per arch) and return the directory of a tiny model: `factory("qwen3")`."""
    built: dict[str, Path] = {}

    def factory(arch: str = "qwen2") -> Path:
        if arch not in built:
            built[arch] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), TinyModelConfig(arch=arch))
        return built[arch]

    return factory


@pytest.fixture(scope="session")
def tiny_model(tiny_model_factory) -> Path:
    """The default tiny Qwen2 model directory."""
    return tiny_model_factory("qwen2")
