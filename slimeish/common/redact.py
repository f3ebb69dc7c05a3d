"""Masking session keys and tokens wherever text may be logged.

A session's base URL is `http://ROUTER/s/<api_key>/v1` and its requests carry
`Authorization: Bearer <api_key>`: the key is a credential, so any path, URL or header that reaches
a log line or an error message goes through `redact` first. `RedactSecrets` does it for every
record a logging handler emits (the router's access log and its own loggers)."""

from __future__ import annotations

import logging
import re

REDACTED = "<redacted>"

_SECRETS = re.compile(
    r"(?P<lead>/s/)[^/\s?#\"']+"  # a session path segment: /s/<key>/...
    r"|(?P<scheme>Bearer\s+)[^\s\"',]+"  # an Authorization header value
    r"|sk-slimeish-[A-Za-z0-9_\-]+",  # a session key anywhere else
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`text` with every session key and bearer token replaced by `<redacted>`."""
    return _SECRETS.sub(lambda m: (m["lead"] or m["scheme"] or "") + REDACTED, text)


class RedactSecrets(logging.Filter):
    """Masks secrets in a record before any handler formats it, traceback included."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            # Arguments stay a tuple: uvicorn's access formatter unpacks them (client, method, path, ...).
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        record.msg = redact(record.msg) if isinstance(record.msg, str) else record.msg
        message = record.getMessage()
        if redact(message) != message:  # an argument that is no string (an exception, a URL) held a key
            record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
