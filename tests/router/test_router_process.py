"""`slimeish router` as a real process writing through to the Redis buffer."""

from __future__ import annotations

import httpx

from slimeish.buffer import Buffer, EmbeddedServer
from slimeish.common.procs import ManagedProcess, free_port, wait_http
from tests.router.conftest import chat_episode


async def test_router_process_writes_turns_through_to_the_buffer(tiny_model, engine_url, tmp_path):
    port = free_port()
    with EmbeddedServer(tmp_path / "buffer") as valkey:
        args = ["router", "--model", str(tiny_model), "--engine", engine_url, "--port", str(port),
                "--buffer-url", valkey.url, "--run-id", "r1", "--admin-token", "t"]  # fmt: skip
        with ManagedProcess.slimeish(*args, log_path=tmp_path / "router.log") as proc:
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/health", timeout=60, proc=proc.proc)
            admin = {"Authorization": "Bearer t"}
            session = httpx.post(url + "/sessions", json={"group_id": "g", "index": 0, "group_size": 1},
                                 headers=admin).json()  # fmt: skip
            assert session["base_url"] == f"{url}/s/{session['api_key']}/v1"
            await chat_episode(session["base_url"], ["hi", "go"], max_tokens=4)
            async with Buffer(valkey.url, "r1") as buffer:
                turns = await buffer.turns(session["session_id"])  # written as each turn completed
                assert [t.turn_index for t in turns] == [0, 1]
                finish = httpx.post(f"{url}/sessions/{session['session_id']}/finish", json={"reward": 1.0},
                                    headers=admin)  # fmt: skip
                assert finish.status_code == 200, finish.text
                (sample,) = await buffer.session_samples(session["session_id"])
        assert sample.tokens == turns[0].prompt_ids + turns[0].output_ids + turns[1].prompt_ids + turns[1].output_ids
        assert sample.reward == 1.0 and sample.weight_versions == [0]
        assert sum(sample.loss_mask) == len(turns[0].output_ids) + len(turns[1].output_ids)


def test_a_router_whose_buffer_is_unreachable_retries_then_exits_naming_it(tiny_model, tmp_path):
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    args = ["router", "--model", str(tiny_model), "--port", str(free_port()), "--buffer-url", closed,
            "--buffer-connect-timeout", "3"]  # fmt: skip
    with ManagedProcess.slimeish(*args, log_path=tmp_path / "router.log") as proc:
        assert proc.proc.wait(300) == 1
    lines = (tmp_path / "router.log").read_text().strip().splitlines()
    assert f"the buffer at {closed} is unreachable (attempt 1" in "\n".join(lines)  # a line per attempt
    assert lines[-1].startswith(f"slimeish router: error: the buffer at {closed} did not answer for ")
    assert lines[-1].endswith("start it or fix --buffer-url")
