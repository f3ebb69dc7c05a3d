"""Convert only what a turn adds: agents resend their whole history every turn, so a dialect keeps
the conversion of the session's last request and, when the new request extends it (a C-level
list compare of the raw items), validates and converts only the new tail. Per-turn cost then
grows with the new items, not with the history, as chat's lazy validation does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slimeish.router.sessions import Session

# (raw items, index of the first to convert, call ids open before it) -> (messages, call ids open after)
Converter = Callable[[list[Any], int, frozenset[str]], tuple[list[dict], frozenset[str]]]


@dataclass(frozen=True)
class Converted:
    raw: list[Any]  # the items as the client sent them
    messages: list[dict]  # their chat messages
    calls: frozenset[str]  # tool call ids the next item may answer


def convert(
    session: Session | None,
    dialect: str,
    raw: list[Any],
    converter: Converter,
    resumable: Callable[[list[Any], int], bool] = lambda raw, start: True,
) -> list[dict]:
    """`raw` as chat messages, reusing the session's previous conversion when `raw` extends it
    (and the dialect says the item at the cut starts a message of its own: `resumable`)."""
    cache = session.converted.get(dialect) if session else None
    n = len(cache.raw) if cache is not None else 0
    if cache is not None and len(raw) > n and raw[:n] == cache.raw and resumable(raw, n):
        new, calls = converter(raw, n, cache.calls)
        done = Converted(raw, cache.messages + new, calls)
    else:
        messages, calls = converter(raw, 0, frozenset())
        done = Converted(raw, messages, calls)
    if session is not None:
        session.converted[dialect] = done
    return done.messages
