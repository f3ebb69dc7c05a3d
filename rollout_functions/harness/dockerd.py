"""A Docker daemon of our own, for when none answers (the tests; a machine without a running one).

`own_daemon(directory)` starts Debian's `dockerd` (package `docker.io`, which `make install`
installs as root) with everything under `directory`: its data root, exec root, pid file and API
socket, so it touches nothing of a system daemon's. Its containers use no network (`network_mode
none`: the router is reached through a Unix socket, bridge.py), so it runs with `--iptables=false
--bridge=none`: no firewall rules, no bridge interface. Root only. Stopped (SIGTERM, which stops
its containers) when the context ends.

As a script it runs one in the foreground and prints the `DOCKER_HOST` to use:

    sudo .venv/bin/python -m slimeish.rollout_functions.harness.dockerd /var/tmp/slimeish-docker
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from slimeish.common.procs import ManagedProcess

START_TIMEOUT_S = 120.0


def answers(socket_path: Path) -> bool:
    """Whether a Docker daemon answers on the Unix socket `socket_path` (its `/_ping`)."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), timeout=5.0) as http:
            return http.get("http://docker/_ping").status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def own_daemon(directory: Path) -> Iterator[str]:
    """Start dockerd with its state under `directory`; yields its `unix://` URL."""
    binary = shutil.which("dockerd")
    if binary is None:
        raise RuntimeError("no dockerd: as root, apt-get install docker.io (or make install)")
    directory.mkdir(parents=True, exist_ok=True)
    socket_path = directory / "docker.sock"
    url = f"unix://{socket_path}"
    argv = [binary, "--data-root", str(directory / "data"), "--exec-root", str(directory / "exec")]
    argv += ["--pidfile", str(directory / "dockerd.pid"), "--host", url, "--iptables=false", "--bridge=none"]
    with ManagedProcess(argv, log_path=directory / "dockerd.log") as daemon:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(socket_path):
            if daemon.proc.poll() is not None or time.monotonic() > deadline:
                log = (directory / "dockerd.log").read_text()[-2000:]
                raise RuntimeError(f"dockerd did not start (see {directory}/dockerd.log):\n{log}")
            time.sleep(0.2)
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where the daemon keeps its images, containers and socket")
    args = parser.parse_args()
    stop = {signal.SIGINT, signal.SIGTERM}
    with own_daemon(args.directory.resolve()) as url:
        # taken by sigwait, not as exceptions; blocked only now, since children inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        print(f"export DOCKER_HOST={url}", flush=True)
        signal.sigwait(stop)


if __name__ == "__main__":
    main()
