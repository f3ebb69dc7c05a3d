"""Write docs/cli.md from the real parsers: `python -m slimeish.cli_docs > docs/cli.md`.

Generated rather than hand-written so the reference can never drift from `--help`; a test
checks that the committed file is current.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os

from slimeish.cli import COMMANDS, main
from slimeish.common.config import add_dataclass_args
from slimeish.rollout import rollout_config_type
from slimeish.train.setup import plugin_title

# (argv, heading) in reading order; nested subcommands get their own section.
PAGES = [
    (["train"], "slimeish train"),
    (["router"], "slimeish router"),
    (["engine"], "slimeish engine"),
    (["buffer", "serve"], "slimeish buffer serve"),
    (["buffer", "stats"], "slimeish buffer stats"),
    (["buffer", "export"], "slimeish buffer export"),
    (["viewer"], "slimeish viewer"),
    (["make-tiny-model"], "slimeish make-tiny-model"),
]

# Built-in rollout functions whose modules declare flags of their own (shown only when selected).
PLUGINS = [
    "slimeish.rollout_functions.openai_agent.generate_rollout",
    "slimeish.rollout_functions.agent_command.generate_rollout",
    "slimeish.rollout_functions.harness.generate_rollout",
    "slimeish.rollout_functions.reasoning_gym_env.generate_rollout",
    "slimeish.rollout_functions.verifiers_env.generate_rollout",
    "slimeish.rollout_functions.textarena_env.generate_rollout",
    "slimeish.rollout_functions.skyrl_gym_env.generate_rollout",
    "slimeish.rollout_functions.gem_env.generate_rollout",
]

HEADER = """# Command-line reference

Generated from the parsers by `python -m slimeish.cli_docs > docs/cli.md`; every flag of
`slimeish train` can also be set in a YAML file given with `--config` (same names, dashes or
underscores; flags on the command line win).

"""


def help_text(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return out.getvalue().rstrip()


def plugin_help(rollout_path: str) -> str:
    """The flags a rollout function's module declares, as `slimeish train --help` shows them."""
    cls = rollout_config_type(rollout_path)
    assert cls is not None, f"{rollout_path} declares no flags"
    parser = argparse.ArgumentParser(prog="slimeish train", usage=argparse.SUPPRESS, add_help=False)
    add_dataclass_args(parser, cls, plugin_title(rollout_path))
    return parser.format_help().strip()


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for a stable file
    commands = "\n".join(f"| `slimeish {name}` | {help_} |" for name, (_, help_) in COMMANDS.items())
    parts = [HEADER, "| command | what it does |\n|---|---|\n" + commands + "\n"]
    parts += [f"\n## `{title}`\n\n```text\n{help_text(argv)}\n```\n" for argv, title in PAGES[:1]]
    parts += [
        f"\n### `slimeish train --rollout-function-path {path}`\n\nAdds the flags this rollout function declares "
        f"(docs/rollout.md):\n\n```text\n{plugin_help(path)}\n```\n"
        for path in PLUGINS
    ]
    parts += [f"\n## `{title}`\n\n```text\n{help_text(argv)}\n```\n" for argv, title in PAGES[1:]]
    return "".join(parts)


if __name__ == "__main__":
    print(render(), end="")
