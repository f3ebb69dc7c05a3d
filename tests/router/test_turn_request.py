"""The /generate body the router sends: the fields it needs for an exact, on-policy capture are its
own, whatever a token-in client's body carries beside them."""

from __future__ import annotations

from slimeish.router.sessions import Session, SessionIdentity
from slimeish.router.turns import TurnRunner


def test_the_routers_own_fields_win_over_a_clients():
    # no engine, store or metrics: building a request body touches none of them
    runner = TurnRunner(None, None, None, routed_experts=True, lora_path="policy")  # type: ignore[arg-type]
    sent = {"lora_path": None, "return_logprob": False, "return_routed_experts": False, "top_logprobs_num": 2}
    body = runner._request(None, [1, 2], {"max_new_tokens": 3}, sent)
    assert body["lora_path"] == "policy" and body["return_logprob"] is True and body["return_routed_experts"] is True
    assert body["top_logprobs_num"] == 2 and body["input_ids"] == [1, 2]


def test_a_session_bound_to_a_policy_samples_with_its_adapter():
    """Several policies share the engines: a session opened with `lora_path` asks for that adapter,
    one opened without it for the router's --lora-path."""
    runner = TurnRunner(None, None, None, lora_path="policy")  # type: ignore[arg-type]

    def session(lora_path: str | None) -> Session:
        identity = SessionIdentity("s", "k", "g", 0, 1, {}, {}, lora_path=lora_path)
        return Session(identity, None)  # type: ignore[arg-type]  # no capture: the body needs none

    assert runner._request(session("run-b"), [1], {}, {})["lora_path"] == "run-b"
    assert runner._request(session(None), [1], {}, {})["lora_path"] == "policy"
    assert "lora_path" not in TurnRunner(None, None, None)._request(session(None), [1], {}, {})  # type: ignore[arg-type]
