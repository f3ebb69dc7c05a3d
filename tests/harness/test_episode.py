"""One harness episode without a model: the reference solution as the agent (Harbor's oracle),
an empty attempt, and each failure classified as the agent's or the infrastructure's."""

from __future__ import annotations

import asyncio

import pytest

from slimeish.rollout_functions.harness.docker import DockerProvider
from slimeish.rollout_functions.harness.episode import (
    EpisodeSpec,
    InfrastructureFailure,
    Outcome,
    OutcomeKind,
    run_episode,
)
from slimeish.rollout_functions.harness.local import LocalProvider
from slimeish.rollout_functions.harness.sandbox import SandboxProvider
from slimeish.rollout_functions.harness.tasks import find_tasks, load_task
from slimeish.rollout_functions.sessions import EpisodeLost
from tests.harness.conftest import EXAMPLE_TASKS, PROVIDERS, container_lost_when_marked, sandbox_lost_when_marked

GRADE_CALC = (  # reward 1 when calc.add adds
    'cd "$APP_DIR"; python3 -c "import calc; assert calc.add(2, 3) == 5" && r=1 || r=0; '
    'echo $r > "$LOGS_DIR/verifier/reward.txt"'
)


def episode(
    tmp_path,
    task_dir,
    command: str,
    *,
    called: bool = True,
    timeout_s: float = 60,
    in_place: bool = False,
    provider: SandboxProvider | None = None,
) -> Outcome:
    """Run one episode (on the local provider unless given one); `called`: whether the session saw a model call."""

    async def model_called() -> bool:
        return called

    spec = EpisodeSpec(
        task=load_task(task_dir), agent_command=command, env={}, timeout_s=timeout_s, grade_in_place=in_place
    )
    return asyncio.run(run_episode(provider or LocalProvider(tmp_path / "sandboxes"), spec, model_called))


def infra(tmp_path, task_dir, command: str, **kw) -> Outcome:
    with pytest.raises(InfrastructureFailure) as caught:
        episode(tmp_path, task_dir, command, **kw)
    assert isinstance(caught.value, EpisodeLost)  # run_groups regenerates it, never trains it
    return caught.value.outcome


@pytest.mark.parametrize("kind", PROVIDERS)
def test_the_reference_solution_scores_1_with_its_patch_and_an_empty_attempt_scores_0(tmp_path, provider_of, kind):
    task, provider = EXAMPLE_TASKS / "fix-add-bug", provider_of(kind)
    solved = episode(tmp_path, task, f"bash {task}/solution/solve.sh", provider=provider)
    assert (solved.kind, solved.reward, solved.agent_exit, solved.grader_exit) == (OutcomeKind.COMPLETED, 1.0, 0, 0)
    assert "-    return a - b\n+    return a + b" in solved.patch
    assert set(solved.timings) == {"sandbox_create_s", "agent_s", "grade_s"}
    empty = episode(tmp_path, task, "true", provider=provider)
    assert (empty.kind, empty.reward, empty.patch) == (OutcomeKind.COMPLETED, 0.0, "")
    assert "AssertionError" in empty.grader_output


@pytest.mark.slow
@pytest.mark.parametrize("task", find_tasks(EXAMPLE_TASKS), ids=lambda t: t.name)
def test_every_example_task_scores_1_solved_and_0_untouched(tmp_path, task):
    assert episode(tmp_path, task.path, f"bash {task.solution}/solve.sh").reward == 1.0
    assert episode(tmp_path, task.path, "true").reward == 0.0


@pytest.mark.parametrize("kind", PROVIDERS)
def test_an_agent_past_its_timeout_is_killed_and_graded_as_its_own_failure(tmp_path, make_task, provider_of, kind):
    task = make_task("slow", files={"calc.py": "def add(a, b):\n    return a - b\n"}, test_sh=GRADE_CALC)
    out = episode(tmp_path, task, "sed -i s/-/+/ calc.py; sleep 600", timeout_s=1.0, provider=provider_of(kind))
    assert out.kind == OutcomeKind.AGENT_TIMEOUT and "agent timeout (1 s)" in out.reason
    assert out.reward == 1.0  # what it left in the workspace is graded: its work counts, as in Harbor


def test_an_agent_error_after_a_model_call_is_the_agents_but_before_one_is_infrastructure(tmp_path, make_task):
    task = make_task("crash")
    assert episode(tmp_path, task, "exit 3", called=True).kind == OutcomeKind.AGENT_ERROR
    lost = infra(tmp_path, task, "echo no such program; exit 127", called=False)
    assert lost.kind == OutcomeKind.AGENT_START_FAILED and "exited with 127" in lost.reason


HOG = "python3 -c \"import time; b = b'x' * (96 << 20); time.sleep(600)\""  # past a 64 MB limit


def test_an_agent_past_the_tasks_memory_is_killed_and_graded_as_its_own_failure(tmp_path, make_task):
    task = make_task("hog", files={"calc.py": "def add(a, b):\n    return a - b\n"}, test_sh=GRADE_CALC, memory_mb=64)
    out = episode(tmp_path, task, f"sed -i s/-/+/ calc.py; {HOG}")
    assert out.kind == OutcomeKind.AGENT_OUT_OF_MEMORY and "memory limit (64 MB)" in out.reason
    assert not out.kind.infrastructure and out.reward == 1.0  # graded as it stood, like a timeout
    lost = infra(tmp_path, task, HOG, called=False)  # the program never reached the model: not the policy's
    assert lost.kind == OutcomeKind.AGENT_START_FAILED and "memory limit" in lost.reason


@pytest.mark.parametrize("where", ["setup", "grader"])
def test_a_sandbox_or_grader_past_the_tasks_memory_is_infrastructure(tmp_path, make_task, where):
    task = make_task(f"hog-{where}", memory_mb=64, **({"setup_sh": HOG} if where == "setup" else {"test_sh": HOG}))
    lost = infra(tmp_path, task, "true")
    kind = OutcomeKind.SANDBOX_FAILED if where == "setup" else OutcomeKind.GRADER_FAILED
    assert lost.kind == kind and "killed at the task's memory limit (64 MB)" in lost.reason


def test_a_broken_sandbox_is_infrastructure(tmp_path, make_task):
    lost = infra(tmp_path, make_task("broken", setup_sh="exit 1"), "true")
    assert lost.kind == OutcomeKind.SANDBOX_FAILED and "setup.sh exited with 1" in lost.reason
    assert lost.kind.infrastructure and lost.agent_exit is None  # the agent never ran


@pytest.mark.parametrize("kind", PROVIDERS)
def test_a_sandbox_removed_from_outside_while_its_agent_runs_is_infrastructure(tmp_path, make_task, provider_of, kind):
    task, root = load_task(make_task("lost")), tmp_path / "sandboxes"
    spec = EpisodeSpec(task=task, agent_command="touch .lose-me; sleep 600", env={}, timeout_s=300)
    provider = provider_of(kind)

    async def model_called() -> bool:  # it talked to the model: only the sandbox's loss makes this infrastructure
        return True

    if isinstance(provider, DockerProvider):
        assert provider.url is not None
        lose = container_lost_when_marked(provider.url, ".lose-me")
    else:
        lose = sandbox_lost_when_marked(root, ".lose-me")
    with lose as removed, pytest.raises(InfrastructureFailure) as caught:
        asyncio.run(run_episode(provider, spec, model_called))
    assert removed.is_set() and isinstance(caught.value, EpisodeLost)  # regenerated, never trained as reward 0
    lost = caught.value.outcome
    assert lost.kind == OutcomeKind.SANDBOX_FAILED and "while a command ran" in lost.reason
    # force-removing a container stops it first: the provider may see either state
    assert "was removed" in lost.reason or "stopped" in lost.reason


@pytest.mark.parametrize(
    "test_sh, problem",
    [
        ("exit 2", "wrote neither"),
        ('echo lots > "$LOGS_DIR/verifier/reward.txt"', "unreadable"),
        ("sleep 600", "timeout"),
    ],
)
def test_a_grader_without_a_reward_is_infrastructure(tmp_path, make_task, test_sh, problem):
    task = make_task("grader", test_sh=test_sh)
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 1.0\n")
    lost = infra(tmp_path, task, "true")
    assert lost.kind == OutcomeKind.GRADER_FAILED and problem in lost.reason


@pytest.mark.parametrize("in_place", [False, True])
def test_a_reward_the_agent_planted_is_not_read(tmp_path, make_task, in_place):
    task = make_task("plant", files={"calc.py": "def add(a, b):\n    return a - b\n"}, test_sh=GRADE_CALC)
    out = episode(tmp_path, task, 'echo 1 > "$LOGS_DIR/verifier/reward.txt"', in_place=in_place)
    assert out.reward == 0.0
