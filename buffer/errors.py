"""Errors for bad input to the buffer: all are `ValueError`s that say what is wrong.

Every check runs before anything is written (in Python, or inside the Lua script that would write),
so a refused call leaves the stored data exactly as it was.
"""

from __future__ import annotations


class BufferInputError(ValueError):
    """Malformed or inconsistent input (lengths differ, missing log-probs, bad segment order)."""


class UnknownSessionError(BufferInputError):
    """The session id was never opened in this run."""


class UnknownGroupError(BufferInputError):
    """The group id is not known in this run."""


class SessionFinishedError(BufferInputError):
    """The session is already finished (appending, or finishing it differently, is refused)."""


class ConflictError(BufferInputError):
    """A write with the same identity (session, group slot, turn index) but different content."""


class StaleWriteError(BufferInputError):
    """A turn written before its session's turns were revoked (`Buffer.revoke_turns`): refused."""


class NotTakenError(BufferInputError):
    """ack/give_back of a group that is not currently handed out to a trainer."""


# Lua scripts raise `redis.error_reply("<CODE> message")`; the code selects the class.
ERROR_CODES: dict[str, type[BufferInputError]] = {
    "BADINPUT": BufferInputError,
    "NOSESSION": UnknownSessionError,
    "UNKNOWNGROUP": UnknownGroupError,  # not NOGROUP: Redis itself replies NOGROUP for a missing consumer group
    "FINISHED": SessionFinishedError,
    "CONFLICT": ConflictError,
    "NOTTAKEN": NotTakenError,
    "STALE": StaleWriteError,
}


def from_script_error(message: str) -> BufferInputError | None:
    """The typed error for a Lua error reply, or None if the reply is not one of ours."""
    code, _, rest = message.partition(" ")
    cls = ERROR_CODES.get(code)
    return cls(rest) if cls else None
