"""The Harbor task format: loading a task, refusing a malformed one, a folder as prompt data."""

from __future__ import annotations

import json

import pytest

from slimeish.rollout_functions.harness.tasks import find_tasks, load_task, main
from tests.harness.conftest import EXAMPLE_TASKS


def test_a_task_reads_its_timeouts_resources_and_instruction(make_task):
    root = make_task("t1", agent_timeout=12.5)
    (root / "task.toml").write_text(
        '[metadata]\ndifficulty = "easy"\n[agent]\ntimeout_sec = 12.5\n[verifier]\ntimeout_sec = 7\nenv = {A = 1}\n'
        "[environment]\nmemory_mb = 512\ncpus = 2\nbuild_timeout_sec = 30\n"
    )
    task = load_task(root)
    assert (task.name, task.instruction) == ("t1", "do t1\n")
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (12.5, 7.0, 30.0)
    assert (task.memory_mb, task.cpus) == (512, 2)
    assert task.verifier_env == {"A": "1"} and task.metadata == {"difficulty": "easy"}


@pytest.mark.parametrize("missing", ["instruction.md", "task.toml", "tests/test.sh"])
def test_a_directory_without_the_required_files_is_refused(make_task, missing):
    root = make_task(f"no-{missing.replace('/', '-')}")
    (root / missing).unlink()
    with pytest.raises(ValueError, match=f"not a Harbor task: it has no {missing}"):
        load_task(root)


def test_a_malformed_task_toml_names_the_file(make_task):
    root = make_task("bad-toml")
    (root / "task.toml").write_text("[agent\n")
    with pytest.raises(ValueError, match=r"task\.toml"):
        load_task(root)


def test_the_example_folder_becomes_prompt_records(tmp_path):
    out = tmp_path / "tasks.jsonl"
    main([str(EXAMPLE_TASKS), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    names = [t.name for t in find_tasks(EXAMPLE_TASKS)]
    assert len(rows) == len(names) >= 12  # the issue asks for at least 12 example tasks
    for row, name in zip(rows, names, strict=True):
        task = load_task(row["label"])
        assert task.name == name == row["metadata"]["task"] and row["prompt"] == task.instruction


@pytest.mark.parametrize(
    "toml, internet",
    [
        ("", (False, False, False)),  # off unless the task asks (Harbor's default is public)
        ('[environment]\nnetwork_mode = "public"\n', (True, True, True)),
        ("[environment]\nallow_internet = true\n", (True, True, True)),  # Harbor's older spelling
        ('[environment]\nnetwork_mode = "public"\n[verifier]\nnetwork_mode = "no-network"\n', (True, True, False)),
        ('[agent]\nnetwork_mode = "public"\n', (False, True, False)),
    ],
)
def test_each_phase_has_the_network_its_task_asks_for(make_task, toml, internet):
    root = make_task("net")
    (root / "task.toml").write_text(toml)
    task = load_task(root)
    assert (task.setup_internet, task.agent_internet, task.verifier_internet) == internet


def test_a_network_mode_the_local_sandbox_cannot_honour_is_refused(make_task):
    root = make_task("allowlist")
    (root / "task.toml").write_text('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n')
    with pytest.raises(ValueError, match=r"network_mode must be one of \('public', 'no-network'\), got 'allowlist'"):
        load_task(root)


def test_the_agents_env_comes_from_its_table(make_task):
    root = make_task("agent-env")
    (root / "task.toml").write_text('[agent]\nenv = {LEVEL = 3, NAME = "x"}\n')
    assert load_task(root).agent_env == {"LEVEL": "3", "NAME": "x"}
