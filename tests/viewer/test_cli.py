"""`slimeish viewer` as a process, with the flags `slimeish train --viewer-port` gives it."""

from __future__ import annotations

import httpx

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from tests.viewer.conftest import ADMIN, RUN_ID


def test_the_viewer_command_serves_a_run(demo_run, tmp_path):
    port = free_port()
    argv = ["viewer", f"--buffer-url={demo_run.buffer_url}", f"--run-dir={demo_run.run_dir}", f"--run-id={RUN_ID}",
            f"--model={demo_run.model}", f"--router-url={demo_run.router_url}", f"--admin-token={ADMIN}",
            f"--port={port}"]  # fmt: skip
    with ManagedProcess.slimeish(*argv, log_path=tmp_path / "viewer.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/", timeout=60, proc=proc.proc)
        auth = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.get(f"{url}/api/runs/{RUN_ID}/steps").status_code == 401
        steps = httpx.get(f"{url}/api/runs/{RUN_ID}/steps", headers=auth).raise_for_status().json()
        assert [s["step"] for s in steps] == [0, 1]
        view = httpx.get(f"{url}/api/runs/{RUN_ID}/samples/{demo_run.script_session}/0", headers=auth).json()
        assert "<script>" in "".join(view["text"])  # decoded with --model's tokenizer
