"""`slimeish buffer serve | stats | export` and the embedded server's lifecycle."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.buffer.cli import main
from slimeish.buffer.server import SERVER_INFO, connect_or_start, running_server_url
from slimeish.common.procs import ManagedProcess, free_port
from tests.buffer.buffer_helpers import write_group

REPO = str(Path(__file__).resolve().parents[2])


def wait_for_file(path: Path, proc: ManagedProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.proc.poll() is None, f"serve exited with {proc.proc.returncode}"
        assert time.monotonic() < deadline
        time.sleep(0.05)


def write(url: str, run_id: str, gid: str, size: int) -> None:
    async def go() -> None:
        async with Buffer(url, run_id) as buf:
            await write_group(buf, gid, size)

    asyncio.run(go())


def test_serve_stats_export_and_restart(tmp_path, tiny_model, capsys):
    run_dir, port = tmp_path / "run", free_port()
    serve = ManagedProcess.slimeish(
        "buffer",
        "serve",
        "--dir",
        str(run_dir),
        "--port",
        str(port),
        env={"PYTHONPATH": REPO},
        log_path=tmp_path / "serve.log",
    )
    with serve:
        wait_for_file(run_dir / SERVER_INFO, serve)
        url = running_server_url(run_dir)
        assert url == f"redis://127.0.0.1:{port}/0"
        write(url, "exp1", "g", 2)
        main(["stats", "--dir", str(run_dir)])  # finds the running server through server.json
        assert "run exp1" in capsys.readouterr().out
        out = tmp_path / "samples.jsonl"
        main(["export", "--format", "jsonl", "--dir", str(run_dir), "--model", str(tiny_model), "--output", str(out)])
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert serve.proc.returncode == 0 and not (run_dir / SERVER_INFO).exists()  # stopped cleanly
    assert sorted(r["index"] for r in rows) == [0, 1]
    assert rows[0]["tokens"] == [1, 2, 3, 4, 5] and rows[0]["loss_mask"] == [1, 1]
    assert isinstance(rows[0]["prompt_text"], str) and isinstance(rows[0]["response_text"], str)
    main(["stats", "--dir", str(run_dir), "--run-id", "exp1"])  # no server now: starts one on the data
    printed = capsys.readouterr().out
    assert "groups_waiting         1" in printed and "sessions_finished      2" in printed


def test_export_needs_a_run_id_when_there_are_several(tmp_path):
    with EmbeddedServer(tmp_path) as server:
        for rid in ("a", "b"):
            write(server.url, rid, "g", 1)
        with pytest.raises(SystemExit, match="runs in this buffer: a, b"):
            main(["export", "--buffer-url", server.url])


def test_one_server_per_directory(tmp_path):
    with EmbeddedServer(tmp_path) as server:
        with pytest.raises(RuntimeError, match="already serves"):
            EmbeddedServer(tmp_path).start()
        with connect_or_start(None, tmp_path) as url:
            assert url == server.url  # reused, not a second server on the same AOF
    assert running_server_url(tmp_path) is None


def serve_process(run_dir: Path, port: int, log: Path) -> ManagedProcess:
    args = ("buffer", "serve", "--dir", str(run_dir), "--port", str(port))
    return ManagedProcess.slimeish(*args, env={"PYTHONPATH": REPO}, log_path=log)


def test_a_killed_serve_takes_its_server_down_and_a_new_one_takes_over(tmp_path):
    """SIGKILL of `buffer serve` (not of its group) must not leave valkey running on the directory,
    and the same command started again serves the same data, without a traceback."""
    run_dir = tmp_path / "run"
    first = serve_process(run_dir, free_port(), tmp_path / "first.log")
    wait_for_file(run_dir / SERVER_INFO, first)
    info = json.loads((run_dir / SERVER_INFO).read_text())
    write(info["url"], "r", "g", 2)
    os.kill(first.proc.pid, signal.SIGKILL)  # the serve process only; valkey is in its own group
    first.proc.wait()
    deadline = time.monotonic() + 10
    while running_server_url(run_dir) is not None:  # valkey got SIGTERM with its owner
        assert time.monotonic() < deadline, "valkey outlived its killed owner"
        time.sleep(0.05)
    second = serve_process(run_dir, free_port(), tmp_path / "second.log")
    with second:
        deadline = time.monotonic() + 30
        while json.loads((run_dir / SERVER_INFO).read_text())["owner"] != second.proc.pid:  # the old file until then
            assert second.proc.poll() is None and time.monotonic() < deadline, (tmp_path / "second.log").read_text()
            time.sleep(0.05)
        url = running_server_url(run_dir)
        assert url is not None and url != info["url"]

        async def stored() -> int:
            async with Buffer(url, "r") as buf:
                return (await buf.stats()).sessions_finished

        assert asyncio.run(stored()) == 2  # acknowledged before the kill, so on disk


def test_a_second_serve_on_a_live_directory_says_why_in_one_line(tmp_path):
    with EmbeddedServer(tmp_path) as server:
        second = serve_process(tmp_path, free_port(), tmp_path / "second.log")
        assert second.proc.wait(timeout=60) == 1
        log = (tmp_path / "second.log").read_text()
        assert f"already serves {tmp_path.resolve()} at {server.url}" in log and "Traceback" not in log
