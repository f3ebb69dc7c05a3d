"""The /generate body the router sends: the fields it needs for an exact, on-policy capture are its
own, whatever a token-in client's body carries beside them."""

from __future__ import annotations

from slimeish.router.turns import TurnRunner


def test_the_routers_own_fields_win_over_a_clients():
    # no engine, store or metrics: building a request body touches none of them
    runner = TurnRunner(None, None, None, routed_experts=True, lora_path="policy")  # type: ignore[arg-type]
    sent = {"lora_path": None, "return_logprob": False, "return_routed_experts": False, "top_logprobs_num": 2}
    body = runner._request([1, 2], {"max_new_tokens": 3}, sent)
    assert body["lora_path"] == "policy" and body["return_logprob"] is True and body["return_routed_experts"] is True
    assert body["top_logprobs_num"] == 2 and body["input_ids"] == [1, 2]
