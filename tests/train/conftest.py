"""Fixtures of the train tests: a tiny prompt set shared by the end-to-end and fault runs, and a
valkey server per test module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from slimeish.buffer import EmbeddedServer


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prompts")
    words = "apple banana cherry grape lemon mango olive peach".split()
    rows = [{"prompt": [{"role": "user", "content": f"say {w}"}], "label": w} for w in words]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    return {"train": root / "train.jsonl", "eval": root / "eval.jsonl"}


@pytest.fixture(scope="module")
def valkey(tmp_path_factory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("valkey")) as server:
        yield server
