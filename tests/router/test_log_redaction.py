"""A session key is a credential: a real router process never writes one to its log."""

from __future__ import annotations

import httpx
import openai

from slimeish.common.procs import ManagedProcess, free_port, wait_http


def test_session_keys_are_masked_in_the_access_log_and_errors(tiny_model, engine_url, tmp_path):
    port, log = free_port(), tmp_path / "router.log"
    args = ["router", "--model", str(tiny_model), "--engine", engine_url, "--port", str(port), "--access-log"]
    with ManagedProcess.slimeish(*args, log_path=log) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=60, proc=proc.proc)
        session = httpx.post(url + "/sessions", json={"group_id": "g", "index": 0, "group_size": 1}).json()
        key = session["api_key"]
        client = openai.OpenAI(base_url=session["base_url"], api_key=key)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.choices[0].message is not None
        unknown = httpx.get(f"{url}/s/{key}/v1/nowhere", headers={"Authorization": f"Bearer {key}"})
        assert unknown.status_code == 404 and key not in unknown.text, unknown.text
        assert "/s/<redacted>/v1/nowhere" in unknown.json()["error"]["message"]
    text = log.read_text()
    assert key not in text and key.removeprefix("sk-slimeish-") not in text
    assert '"POST /s/<redacted>/v1/chat/completions HTTP/1.1" 200' in text, text
    assert '"GET /s/<redacted>/v1/nowhere HTTP/1.1" 404' in text, text
