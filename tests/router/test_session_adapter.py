"""A session bound to a LoRA adapter (`lora_path` in POST /sessions) is checked when it is opened:
an adapter no engine serves (never loaded, or unloaded) is a 400 naming the loaded ones, not a
failure at the first turn.
The engine is real, its adapter a real PEFT directory."""

from __future__ import annotations

import httpx

from tests.peft_adapters import write_peft_adapter


def test_a_session_naming_an_adapter_no_engine_serves_is_refused_when_opened(
    router_factory, extra_engine, tiny_model, tmp_path
):
    _, engine = extra_engine
    router = router_factory([engine])

    def open_session(adapter: str) -> httpx.Response:
        return httpx.post(router.url + "/sessions", json={"lora_path": adapter}, headers=router.admin, timeout=60)

    refused = open_session("policy")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("lora_path", "adapter_not_loaded")
    assert "'policy'" in error["message"] and "loaded: []" in error["message"]

    # loaded on the engine by another run's sync (not through this router): the engine is asked again
    adapter = write_peft_adapter(tiny_model, tmp_path / "policy", seed=1)
    body = {"lora_name": "policy", "lora_path": adapter}
    httpx.post(engine + "/load_lora_adapter", json=body, timeout=60).raise_for_status()
    assert open_session("policy").status_code == 200
    other = open_session("other")
    assert other.status_code == 400 and "loaded: ['policy']" in other.json()["error"]["message"]

    # the run is over: its adapter unloaded through the router, a new session naming it is refused
    unload = httpx.post(router.url + "/admin/unload_lora_adapter", json={"lora_name": "policy"}, headers=router.admin)
    assert unload.status_code == 200 and unload.json()["ok"], unload.text
    after = open_session("policy")
    assert after.status_code == 400 and "loaded: []" in after.json()["error"]["message"], after.text
