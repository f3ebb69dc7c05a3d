import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from slimeish.common.config import add_dataclass_args, from_namespace, help_field, load_yaml


@dataclass(kw_only=True)
class Demo:
    name: str = help_field(help="required name")
    steps: int = help_field(3, help="how many")
    mode: Literal["sync", "async"] = help_field("sync", help="mode")
    urls: list[str] = help_field([], help="repeatable")
    flag: bool = help_field(False, help="a switch")
    path: Path | None = help_field(None, help="a path")


def _parse(argv, base=None):
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Demo)
    return from_namespace(Demo, parser.parse_args(argv), base)


def test_flags_map_onto_fields():
    d = _parse(["--name", "x", "--steps", "5", "--mode", "async", "--urls", "a", "b", "--flag", "--path", "/tmp"])
    assert d == Demo(name="x", steps=5, mode="async", urls=["a", "b"], flag=True, path=Path("/tmp"))


def test_cli_overrides_yaml_and_yaml_overrides_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: from-yaml\nsteps: 9\nmode: async\n")
    d = _parse(["--steps", "1"], load_yaml(cfg))
    assert (d.name, d.steps, d.mode) == ("from-yaml", 1, "async")


def test_missing_required_and_bad_choice():
    with pytest.raises(ValueError, match="--name"):
        _parse([])
    with pytest.raises(SystemExit):
        _parse(["--name", "x", "--mode", "other"])


def test_help_text_shows_defaults():
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Demo)
    text = parser.format_help()
    assert "--steps STEPS" in text and "how many (default: 3)" in text and "required name (required)" in text


def test_list_flags_repeat_and_accumulate():
    assert _parse(["--name", "x", "--urls", "a", "--urls", "b", "c"]).urls == ["a", "b", "c"]
