"""`slimeish router` flags map onto RouterConfig (uvicorn.run is replaced: nothing is served)."""

from __future__ import annotations

from unittest import mock

import pytest

import slimeish.router.server as server


def parsed(argv: list[str]):
    with mock.patch.object(server.uvicorn, "run"), mock.patch.object(server, "create_app") as create:
        server.main(argv)
    return create.call_args[0][0]


def test_flags(tiny_model):
    config = parsed(
        ["--model", str(tiny_model), "--engine", "http://a", "--engine", "http://b", "--admin-token", "t",
         "--buffer-url", "redis://x/0", "--run-id", "r", "--allow-anonymous", "--port", "9"]
    )  # fmt: skip
    assert config.engine == ["http://a", "http://b"]
    assert (config.admin_token, config.buffer_url, config.run_id, config.allow_anonymous, config.port) == (
        "t", "redis://x/0", "r", True, 9,
    )  # fmt: skip


def test_model_is_required():
    with pytest.raises(SystemExit):
        parsed(["--engine", "http://a"])
