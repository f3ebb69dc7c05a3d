"""`slimeish buffer serve | stats | export` and the embedded server's lifecycle."""

from __future__ import annotations

import asyncio
import json
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
