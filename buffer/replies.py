"""Redis replies read into named values, so the client never reads a reply by its position.

The buffer's client never sets `decode_responses`, so every string in a reply is `bytes`;
redis-py's stubs also allow `str` (for clients that decode), which `as_bytes` rules out here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

Fields = dict[str, bytes | None]


def as_bytes(value: bytes | str | None) -> bytes | None:
    """A reply value as the bytes it is (known by construction: replies are never decoded)."""
    return cast("bytes | None", value)


def hash_fields(names: Sequence[str], reply: Sequence[bytes | str | None]) -> Fields:
    """An HMGET reply keyed by the field names it asked for (None: the field is not set)."""
    return {name: as_bytes(value) for name, value in zip(names, reply, strict=True)}


def required(fields: Fields, name: str) -> bytes:
    """A field the scripts always write together with the others read beside it."""
    value = fields[name]
    assert value is not None, f"stored record lacks its {name!r} field"
    return value


def hash_values(reply: Mapping[Any, bytes | str]) -> list[bytes]:
    """The values of an HGETALL reply (turns or sample headers: their keys repeat what they hold)."""
    return cast("list[bytes]", list(reply.values()))


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One entry of the ready stream: a trainable group, or None if the entry was deleted after
    it was delivered (a pending read returns such entries without their fields)."""

    entry_id: str
    group_id: str | None


def _entry(entry: tuple[bytes, dict[bytes, bytes] | None]) -> StreamEntry:
    entry_id, fields = entry
    return StreamEntry(entry_id.decode(), fields[b"group"].decode() if fields else None)


def read_entries(reply: Any) -> list[StreamEntry]:
    """The entries of an XREADGROUP reply on one stream: `[[stream, [(id, fields), ...]]]` (or empty)."""
    if not reply:
        return []
    ((_stream, entries),) = reply
    return [_entry(e) for e in entries]


def claimed_entries(reply: Any) -> list[StreamEntry]:
    """The entries an XAUTOCLAIM reply claimed: `[next_cursor, [(id, fields), ...], deleted_ids]`."""
    _cursor, claimed, *_deleted = reply
    return [_entry(e) for e in claimed]


def sessions_by_index(members: dict[bytes, bytes]) -> list[tuple[int, str]]:
    """A members hash (index -> session id) as (index, session id) pairs, by index."""
    return sorted((int(index), sid.decode()) for index, sid in members.items())
