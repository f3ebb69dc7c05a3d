"""Convert only what a turn adds: agents resend their whole history every turn, so a dialect keeps
the conversion of the session's last request and, when the new request extends it, validates and
converts only the new tail. Per-turn cost then grows with the new items, not with the history,
as chat's lazy validation does.

The items last sent are kept as their JSON, not as the request's objects: those are many small
containers per item (a Responses message item is five), parsed anew every turn and alive until
the next one, so the collector promoted them all and ran full collections over every session's
history to free them (the Responses and Messages p99 at 256 sessions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from slimeish.router.jsontypes import JSONObject
from slimeish.router.sessions import Session

# (raw items, index of the first to convert, call ids open before it) -> (messages, call ids open after)
Converter = Callable[[list[Any], int, frozenset[str]], tuple[list[JSONObject], frozenset[str]]]


@dataclass(frozen=True)
class Converted:
    count: int  # how many items the client sent
    raw: bytes  # them, as JSON (`orjson.dumps`)
    messages: list[JSONObject]  # their chat messages
    calls: frozenset[str]  # tool call ids the next item may answer

    def extended_by(self, raw: list[Any], dumped: bytes) -> bool:
        """Whether `raw` (`dumped` as JSON) is these items and more. JSON values delimit
        themselves, so the first `count` items are these exactly when the JSON array of `raw`
        starts with theirs up to its closing bracket, then a comma."""
        n = len(self.raw) - 1
        return len(raw) > self.count and dumped[n : n + 1] == b"," and dumped[:n] == self.raw[:n]


def convert(
    session: Session | None,
    dialect: str,
    raw: list[Any],
    converter: Converter,
    resumable: Callable[[list[Any], int], bool] = lambda raw, start: True,
) -> list[JSONObject]:
    """`raw` as chat messages, reusing the session's previous conversion when `raw` extends it
    (and the dialect says the item at the cut starts a message of its own: `resumable`)."""
    cache = session.memory.converted.get(dialect) if session else None
    dumped = orjson.dumps(raw)
    if cache is not None and cache.extended_by(raw, dumped) and resumable(raw, cache.count):
        new, calls = converter(raw, cache.count, cache.calls)
        done = Converted(len(raw), dumped, cache.messages + new, calls)
    else:
        messages, calls = converter(raw, 0, frozenset())
        done = Converted(len(raw), dumped, messages, calls)
    if session is not None:
        session.memory.converted[dialect] = done
    return done.messages
