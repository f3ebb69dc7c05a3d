"""The sandbox providers (local with and without bubblewrap, docker): isolation, the network limited
to the router, a timeout that kills the whole process group, the task's memory."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import random
import shutil
import signal
import threading
from pathlib import Path

import pytest

from slimeish.rollout_functions.harness.bridge import RouterBridge
from slimeish.rollout_functions.harness.local import LocalProvider, LocalSandbox, bwrap_argv
from slimeish.rollout_functions.harness.sandbox import Network, Sandbox, SandboxProvider, describe_exit
from slimeish.rollout_functions.harness.tasks import load_task
from tests.harness.conftest import PROVIDERS, needs_bwrap, needs_docker


def processes_running(marker: str) -> list[int]:
    """Live processes (zombies have no cmdline) whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # it ended while we looked
                pass
    return found


async def sandbox(make_task, tmp_path, bwrap: str, **task) -> LocalSandbox:
    provider = LocalProvider(tmp_path / "sandboxes", bwrap)  # type: ignore[arg-type]
    created = await provider.create(load_task(make_task(**task)))
    assert isinstance(created, LocalSandbox)
    return created


async def any_sandbox(provider: SandboxProvider, make_task, **task) -> Sandbox:
    return await provider.create(load_task(make_task(**task)))


@pytest.mark.parametrize("kind", PROVIDERS)
def test_a_timeout_kills_the_whole_process_group(make_task, provider_of, kind):
    marker = str(random.randrange(10**8, 10**9))  # a sleep no other process runs (a container's are the host's too)

    async def scenario():
        box = await any_sandbox(provider_of(kind), make_task, name=f"timeout-{kind}")
        # a background child, and its own child, outlive the shell unless the group is killed
        command = f"(sleep {marker} &) ; sleep {marker} & echo started; wait"
        result = await box.exec(command, env={}, timeout_s=1.0)
        await box.destroy()
        return result

    result = asyncio.run(scenario())
    assert result.timed_out and "started" in result.output
    assert processes_running(f"sleep\0{marker}") == []


@pytest.mark.parametrize("kind", PROVIDERS)
def test_a_command_ends_when_it_exits_though_a_process_it_left_running_holds_its_output(make_task, provider_of, kind):
    marker = str(random.randrange(10**8, 10**9))

    async def scenario():
        box = await any_sandbox(provider_of(kind), make_task, name=f"left-running-{kind}")
        try:  # the background sleep holds the command's output for as long as it lives
            return await box.exec(f"sleep {marker} & echo started", env={}, timeout_s=30.0)
        finally:
            await box.destroy()

    try:
        result = asyncio.run(scenario())
    finally:  # without bubblewrap's PID namespace or a container, it outlives the sandbox
        for pid in processes_running(f"sleep\0{marker}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert result.output.startswith("started\n")


@needs_bwrap
def test_an_agent_can_write_only_its_workspace_and_never_sees_another_episode(make_task, tmp_path):
    host_file = Path(os.environ.get("HOME", "/root")) / f".slimeish-harness-probe-{random.randrange(10**9)}"
    outside = tmp_path / "outside.txt"
    outside.write_text("host\n")

    async def scenario():
        first = await sandbox(make_task, tmp_path, "on", name="first", files={"secret.txt": "first's\n"})
        second = await sandbox(make_task, tmp_path, "on", name="second")
        writes = await second.exec(
            f"echo x > {host_file}; echo x > {outside}; echo x > /etc/slimeish-probe; echo mine > /app/mine.txt",
            env={}, timeout_s=30,
        )  # fmt: skip
        peeks = await second.exec(f"cat {first.dir}/app/secret.txt; ls {first.dir.parent}", env={}, timeout_s=30)
        tmp = await second.exec("echo t > /tmp/t && ls /tmp", env={}, timeout_s=30)
        first_tmp = await first.exec("ls /tmp", env={}, timeout_s=30)
        mine = (second.dir / "app" / "mine.txt").read_text()
        await first.destroy()
        await second.destroy()
        return writes, peeks, tmp, first_tmp, mine

    writes, peeks, tmp, first_tmp, mine = asyncio.run(scenario())
    assert writes.exit_code == 0 and mine == "mine\n"  # its workspace is writable
    assert writes.output.count("Read-only file system") + writes.output.count("No such file or directory") == 3
    assert not host_file.exists() and outside.read_text() == "host\n"
    assert not Path("/etc/slimeish-probe").exists()
    assert peeks.exit_code != 0 and "first's" not in peeks.output
    assert tmp.output.split() == ["t"] and first_tmp.output.split() == []  # /tmp is each one's own


def test_a_failing_setup_script_is_a_sandbox_error_and_leaves_nothing(make_task, tmp_path):
    from slimeish.rollout_functions.harness.sandbox import SandboxError

    provider = LocalProvider(tmp_path / "sandboxes", "auto")
    task = load_task(make_task("broken", setup_sh="echo cannot build; exit 7"))
    with pytest.raises(SandboxError, match=r"setup\.sh exited with 7: cannot build"):
        asyncio.run(provider.create(task))
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_a_command_sees_none_of_the_hosts_environment(make_task, tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMEISH_HOST_SECRET", "host-only")
    bwraps = ["on", "off"] if shutil.which("bwrap") else ["off"]

    async def scenario(bwrap: str):
        box = await sandbox(make_task, tmp_path, bwrap, name=f"env-{bwrap}")
        result = await box.exec("env", env={"GIVEN": "yes"}, timeout_s=30)
        await box.destroy()
        return dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)

    for bwrap in bwraps:
        seen = asyncio.run(scenario(bwrap))
        assert "SLIMEISH_HOST_SECRET" not in seen and seen["GIVEN"] == "yes"
        assert seen["PATH"] == os.environ["PATH"] and {"HOME", "TMPDIR", "APP_DIR"} <= set(seen)
        assert seen["HOME"] != os.environ.get("HOME")


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_servers():
    """Two real HTTP servers on the host's loopback: one plays the router, the other anything else."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [server.server_address[1] for server in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


FETCH = (  # prints each URL's body, or the error connecting to it
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    try: print(urllib.request.urlopen(url, timeout=10).read().decode())\n"
    "    except OSError as exc: print('failed', url, exc)\n"
)


def fetch(provider: SandboxProvider, make_task, tmp_path, urls: str, network: Network, env=None) -> str:
    """FETCH's output for `urls`, run in a fresh sandbox with `network`."""
    script = tmp_path / "fetch"
    script.mkdir(exist_ok=True)
    (script / "fetch.py").write_text(FETCH)

    async def scenario() -> str:
        box = await any_sandbox(provider, make_task, name=f"net-{network.internet}")
        await box.upload(script, "/tmp/fetch")
        result = await box.exec(f"python3 /tmp/fetch/fetch.py {urls}", env=env or {}, timeout_s=60, network=network)
        await box.destroy()
        return result.output

    return asyncio.run(scenario())


@pytest.mark.parametrize("kind", [pytest.param("on", marks=needs_bwrap), pytest.param("docker", marks=needs_docker)])
def test_without_a_network_a_command_reaches_the_router_and_nothing_else(
    make_task, tmp_path, http_servers, provider_of, kind
):
    router, other = http_servers
    urls = f"http://127.0.0.1:{router}/v1 http://127.0.0.1:{other}/ http://10.255.255.1:80/"
    off = fetch(provider_of(kind), make_task, tmp_path, urls, Network(router=("127.0.0.1", router)))
    assert f"hello from {router}" in off  # the router, through the bridge
    assert f"failed http://127.0.0.1:{other}/" in off and f"hello from {other}" not in off
    assert "failed http://10.255.255.1:80/" in off and "unreachable" in off


@needs_bwrap
def test_with_the_internet_a_local_command_has_the_hosts_network(make_task, tmp_path, http_servers, provider_of):
    router, other = http_servers
    on = fetch(
        provider_of("on"),
        make_task,
        tmp_path,
        f"http://127.0.0.1:{router}/ http://127.0.0.1:{other}/",
        Network(internet=True),
    )
    assert f"hello from {router}" in on and f"hello from {other}" in on


@needs_bwrap
def test_without_a_network_the_agents_url_names_the_bridge_whatever_the_routers_host(make_task, tmp_path):
    # the router on 127.0.0.2, the host's loopback but not the bridge's address inside (as a router
    # on another machine): the agent's base URL is rewritten to the bridge, 127.0.0.1 on its port
    router = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Hello)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    port = router.server_address[1]
    (tmp_path / "fetch.py").write_text(FETCH)

    async def scenario():
        box = await sandbox(make_task, tmp_path, "on", name="net-router-host")
        shutil.copy(tmp_path / "fetch.py", box.dir / "app")
        env = {"OPENAI_BASE_URL": f"http://127.0.0.2:{port}/s/k/v1"}
        command = 'echo "url=$OPENAI_BASE_URL"; python3 fetch.py "$OPENAI_BASE_URL"'
        result = await box.exec(command, env=env, timeout_s=60, network=Network(router=("127.0.0.2", port)))
        await box.destroy()
        return result.output

    try:
        out = asyncio.run(scenario())
    finally:
        router.shutdown()
        router.server_close()
    assert f"url=http://127.0.0.1:{port}/s/k/v1" in out and f"hello from {port}" in out, out


def test_only_urls_naming_the_router_are_rewritten_for_the_inside():
    bridge = RouterBridge(("router.internal", 30000))
    try:
        env = {
            "OPENAI_BASE_URL": "http://router.internal:30000/s/k/v1",
            "ANTHROPIC_BASE_URL": "https://user@ROUTER.internal:30000/s/k",
            "OTHER_PORT": "http://router.internal:30001/",
            "OTHER_HOST": "http://elsewhere:30000/",
            "SLIMEISH_INSTRUCTION": "fetch http://router.internal:30000/ and fix it",
        }
        inside = bridge.inside_env(env)
    finally:
        shutil.rmtree(bridge.dir)
    assert inside == env | {
        "OPENAI_BASE_URL": "http://127.0.0.1:30000/s/k/v1",
        # https keeps its host name for the certificate check; the sandbox's /etc/hosts resolves it
        "ANTHROPIC_BASE_URL": "https://user@router.internal:30000/s/k",
    }


async def test_a_router_on_a_low_port_or_https_is_reached_inside_by_a_port_and_name_that_work():
    """Unprivileged, the inside end cannot listen below 1024: it listens 10000 higher. An https
    URL keeps its host name (its TLS certificate names it), which the sandbox's hosts file maps to
    the inside end; an https URL naming an address can only become 127.0.0.1."""
    async with RouterBridge(("router.internal", 443)) as bridge:
        inside = bridge.inside_env({"A": "https://router.internal/v1", "B": "http://router.internal:443/v1"})
        assert inside == {"A": "https://router.internal:10443/v1", "B": "http://127.0.0.1:10443/v1"}
        assert bridge.inside_argv()[-3] == "10443"  # the inside end's port
        hosts = bridge.hosts_file.read_text()
        assert hosts.startswith("127.0.0.1 localhost router.internal\n")
        assert hosts.endswith(Path("/etc/hosts").read_text())  # the host's own names (its hostname) kept
        argv = bwrap_argv(Path("/tmp/box"), Path("/tmp"), internet=False, bridge=bridge)
        at = argv.index(str(bridge.hosts_file))
        assert argv[at - 1 : at + 2] == ["--ro-bind", str(bridge.hosts_file), "/etc/hosts"]
        assert at > argv.index("/etc")  # over the host's /etc, bound before it
    async with RouterBridge(("10.1.2.3", 8443)) as bridge:
        assert bridge.inside_env({"A": "https://10.1.2.3:8443/v1"}) == {"A": "https://127.0.0.1:8443/v1"}


@pytest.mark.parametrize("kind", PROVIDERS)
def test_a_command_past_the_tasks_memory_is_killed_and_said_to_be(make_task, tmp_path, provider_of, kind):
    # 96 MB held (touched, so resident) against a 64 MB limit; under the 2x data-segment backstop
    hog = "python3 -c \"import time; b = b'x' * (96 << 20); print('allocated', flush=True); time.sleep(600)\""

    async def scenario():
        box = await any_sandbox(provider_of(kind), make_task, name=f"hog-{kind}", memory_mb=64)
        small = await box.exec("python3 -c \"b = b'x' * (8 << 20); print('fits')\"", env={}, timeout_s=60)
        big = await box.exec(hog, env={}, timeout_s=300)
        await box.destroy()
        return small, big

    small, big = asyncio.run(scenario())
    assert (small.exit_code, small.out_of_memory, small.output.strip()) == (0, False, "fits")
    assert big.out_of_memory and not big.timed_out and big.exit_code != 0  # killed allocating, or holding it
    assert describe_exit(big, load_task(tmp_path / "tasks" / f"hog-{kind}")) == (
        "was killed at the task's memory limit (64 MB)"
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to pin to fewer")
def test_a_tasks_cpus_pin_its_commands_to_that_many_cores(make_task, tmp_path):
    async def scenario():
        box = await sandbox(make_task, tmp_path, "auto", name="cpus", cpus=1)
        result = await box.exec("nproc", env={}, timeout_s=30)
        await box.destroy()
        return result

    assert asyncio.run(scenario()).output.strip() == "1"
