"""Existing engines are checked at start-up: down, or reporting a non-integer weight version."""

import pytest
from fastapi import FastAPI

from slimeish.launch import check_engine
from slimeish.procs import free_port
from tests.stand_in import serve_app


def _model_info_server(version):
    """Stands in for an SGLang server's /model_info only."""
    app = FastAPI()

    @app.get("/model_info")
    def model_info():
        return {"model_path": "m", "weight_version": version}

    return app


@pytest.mark.parametrize("version", ["0", "7", 3, None])
def test_integer_versions_pass(version):
    with serve_app(_model_info_server(version)) as url:
        assert check_engine(url + "/") == url


def test_sglang_default_version_names_the_fix():
    with serve_app(_model_info_server("default")) as url, pytest.raises(ValueError, match="--weight-version 0"):
        check_engine(url)


def test_unreachable_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="is the server running"):
        check_engine(f"http://127.0.0.1:{free_port()}")


def test_flag_values_starting_with_a_dash_stay_values():
    import argparse

    from slimeish.launch import flags

    parser = argparse.ArgumentParser()
    parser.add_argument("--admin-token")
    parser.add_argument("--run-id")
    args = parser.parse_args(flags(admin_token="-Xy_z", run_id="r1"))
    assert (args.admin_token, args.run_id) == ("-Xy_z", "r1")
