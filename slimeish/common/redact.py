"""Masking session keys and tokens wherever text may be logged.

A session's base URL is `http://ROUTER/s/<api_key>/v1` and its requests carry
`Authorization: Bearer <api_key>`: the key is a credential, so any path, URL or header that reaches
a log line or an error message goes through `redact` first. `RedactSecrets` does it for every
record a logging handler emits (the router's access log and its own loggers)."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, TextIO

REDACTED = "<redacted>"

_SECRETS = re.compile(
    r"(?P<lead>/s/)(?!%[srd])[^/\s?#\"']+"  # a session path segment: /s/<key>/... (not a log format's /s/%s)
    r"|(?P<scheme>Bearer\s+)[^\s\"',]+"  # an Authorization header value
    r"|sk-slimeish-[A-Za-z0-9_\-]+",  # a session key anywhere else
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`text` with every session key and bearer token replaced by `<redacted>`."""
    return _SECRETS.sub(lambda m: (m["lead"] or m["scheme"] or "") + REDACTED, text)


def redact_json(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, strings) with `redact` applied to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v) for v in value]
    return value


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


class RedactedStream:
    """A text stream (stderr) that masks secrets in what is written to it: the last traceback of
    a process, whoever prints it (Python's hook, or torch.distributed's, which prefixes the rank)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def mask_loggers(*prefixes: str) -> None:
    """Install `RedactSecrets` on every logger named by or under `prefixes` that exists now: a
    record is then masked as it is logged, before any handler sees it, whoever configured the
    handlers (pytest's log capture, an embedding program's). A logger's filters do not apply to
    its children's records, so each is filtered itself; loggers are created on import, so call
    this once the modules that log are imported."""
    for name in [*prefixes, *logging.Logger.manager.loggerDict]:
        if not any(name == p or name.startswith(p + ".") for p in prefixes):
            continue
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())


def mask_process_logs() -> None:
    """Mask secrets in all this process logs through the root logger's handlers (every library's
    loggers propagate there: an httpx error quotes its URL, a session's `/s/<key>/...`), and in
    all it writes to stderr."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
    if not isinstance(sys.stderr, RedactedStream):
        sys.stderr = RedactedStream(sys.stderr)
