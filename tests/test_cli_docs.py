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


def test_every_command_has_a_section():
    from slimeish.cli import COMMANDS
    from slimeish.cli_docs import PAGES

    documented = {argv[0] for argv, _ in PAGES}
    assert documented == set(COMMANDS), f"commands without a section in docs/cli.md: {set(COMMANDS) - documented}"
