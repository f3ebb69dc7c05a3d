"""`slimeish router` flags map onto RouterConfig (uvicorn.run and the wait for the buffer are replaced:
nothing is served or connected to)."""

from __future__ import annotations

from unittest import mock

import pytest

import slimeish.router.server as server


def parsed(argv: list[str]):
    with (
        mock.patch.object(server.uvicorn, "run"),
        mock.patch.object(server, "wait_for_buffer", mock.AsyncMock()),
        mock.patch.object(server, "create_app") as create,
    ):
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


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "router.example"])
def test_a_non_loopback_host_needs_an_admin_token(tiny_model, host, capsys):
    with pytest.raises(SystemExit) as e:
        parsed(["--model", str(tiny_model), "--host", host])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--admin-token" in err and "--insecure-no-admin-token" in err
    assert "Traceback" not in err
    assert parsed(["--model", str(tiny_model), "--host", host, "--admin-token", "t"]).host == host
    assert parsed(["--model", str(tiny_model), "--host", host, "--insecure-no-admin-token"]).insecure_no_admin_token


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_needs_no_admin_token(tiny_model, host):
    assert parsed(["--model", str(tiny_model), "--host", host]).admin_token is None
