"""`slimeish engine --help` documents every flag of EngineConfig."""

from __future__ import annotations

import dataclasses

import pytest

from slimeish.engine.config import EngineConfig
from slimeish.engine.server import main


def test_help_lists_every_flag_with_its_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(EngineConfig):
        assert "--" + f.name.replace("_", "-") in out
        assert " ".join(f.metadata["help"].split()) in out
