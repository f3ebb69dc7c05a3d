"""A session key is a credential: a real router process never writes one to its log."""

from __future__ import annotations

import logging

import httpx
import openai

from slimeish.common.procs import ManagedProcess, free_port, wait_http
from slimeish.router.config import RouterConfig
from slimeish.router.server import create_app


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


class Kept(logging.Handler):
    """The lines a logger's own handler writes (a test's: the log config an earlier test installed,
    `propagate=False` on `slimeish` or `uvicorn`, keeps records from pytest's root-level capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(logging.Formatter().format(record))


def test_a_router_served_in_process_masks_what_it_logs(tiny_model):
    """`create_app` masks the router's loggers themselves: an app served by a test's server or an
    embedding program (no `slimeish router` log config) logs no key either, tracebacks included."""
    create_app(RouterConfig(model=tiny_model, engine=[]))
    key = "sk-slimeish-" + "k" * 43
    kept = Kept()
    names = ("slimeish.router.errors", "slimeish.router.engine_pool", "uvicorn.error", "uvicorn.access")
    for name in names:
        logging.getLogger(name).addHandler(kept)
    try:
        for name in names[:3]:
            try:
                raise RuntimeError(f"POST http://r/s/{key}/v1/chat/completions failed")
            except RuntimeError as e:
                message = "internal error on POST /s/%s/v1/chat/completions: %s"
                logging.getLogger(name).error(message, key, e, exc_info=e)
        # an access record keeps its five arguments: uvicorn's access formatter unpacks them
        path = f"/s/{key}/v1/chat/completions"
        logging.getLogger("uvicorn.access").warning('%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "POST", path, "1.1", 200)
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(kept)
    text = "\n".join(kept.lines)
    assert len(kept.lines) == 4, text
    assert key not in text and text.count("/s/<redacted>/v1/chat/completions") >= 4, text
