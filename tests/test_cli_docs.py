"""docs/cli.md is generated from the parsers; this fails when a flag changed and the doc did not."""

from pathlib import Path

from slimeish.cli_docs import render

DOC = Path(__file__).parents[1] / "docs" / "cli.md"


def test_cli_reference_is_current():
    assert DOC.read_text() == render(), "run: python -m slimeish.cli_docs > docs/cli.md"


def test_top_level_help_lists_every_command(capsys):
    from slimeish.cli import COMMANDS, main

    main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)
