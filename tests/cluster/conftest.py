"""The train tests' prompt set, for the runs on a simulated Ray cluster."""

from tests.train.conftest import prompts  # noqa: F401 - a fixture, used by name
