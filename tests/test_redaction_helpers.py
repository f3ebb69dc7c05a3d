"""What is stored or logged beside a session holds no credential: the pure masking helpers."""

from __future__ import annotations

from slimeish.common.redact import redact_json
from slimeish.router.storage import shown_url

KEY = "sk-slimeish-" + "abc" * 8


def test_redact_json_masks_every_string_and_keeps_the_shape():
    record = {
        "kind": "agent_error",
        "reason": f"POST http://127.0.0.1:9/s/{KEY}/v1/responses failed",
        "exit_codes": [1, None],
        "timings": {"agent": 1.5},
        "lines": [f"Authorization: Bearer {KEY}", "fine"],
    }
    masked = redact_json(record)
    assert KEY not in repr(masked)
    assert masked["reason"] == "POST http://127.0.0.1:9/s/<redacted>/v1/responses failed"
    assert masked["exit_codes"] == [1, None] and masked["timings"] == {"agent": 1.5}
    assert masked["lines"] == ["Authorization: Bearer <redacted>", "fine"]


def test_shown_url_masks_a_percent_encoded_password():
    assert shown_url("redis://:p%40ss@host:6379/0") == "redis://:<redacted>@host:6379/0"
    assert shown_url("redis://user:pw@host/0") == "redis://user:<redacted>@host/0"
    assert shown_url("redis://host:6379/0") == "redis://host:6379/0"
