"""Compact binary encoding of turns and sample headers: msgpack with token arrays as packed bytes.

Token ids are int32 and log-probs float32, little-endian, so an 8k-token turn is ~56 KB instead
of the ~150 KB of JSON text, and decoding is one `np.frombuffer` per array. Token arrays are
stored once, in the turns; a sealed sample stores only its header and is rebuilt from the
turns (a few numpy concatenations) when read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np
import orjson

from slimeish.buffer.records import PackedTurn
from slimeish.buffer.replies import hash_values
from slimeish.buffer.segments import PackedSample, assemble
from slimeish.common.sample import Sample

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])  # a stored turn or sample header: a map of fields
I32, F32 = np.dtype("<i4"), np.dtype("<f4")
_TURN_ARRAYS = {"prompt_ids": I32, "output_ids": I32, "output_logprobs": F32}
_SAMPLE_ARRAYS = ("tokens", "loss_mask", "rollout_log_probs", "rollout_routed_experts")


def encode_turn(turn: PackedTurn) -> bytes:
    fields = {name: getattr(turn, name) for name in PackedTurn.__slots__}
    for name, dtype in _TURN_ARRAYS.items():
        fields[name] = fields[name].astype(dtype, copy=False).tobytes()
    return _encoder.encode(fields)


def decode_turn(data: bytes) -> PackedTurn:
    fields = _decoder.decode(data)
    for name, dtype in _TURN_ARRAYS.items():
        fields[name] = np.frombuffer(fields[name], dtype=dtype)
    return PackedTurn(**fields)


def encode_sample_header(sample: PackedSample) -> bytes:
    """A sample without its arrays (rebuilt from the session's immutable turns when read) and
    without its reward (kept on the session, so it can arrive after the finish)."""
    return _encoder.encode(
        {name: getattr(sample, name) for name in PackedSample.__slots__ if name not in _SAMPLE_ARRAYS}
    )


def decode_sample_header(data: bytes) -> dict[str, Any]:
    return _decoder.decode(data)


def decode_turns(stored: Mapping[Any, bytes | str]) -> list[PackedTurn]:
    """A session's turns hash, decoded, in turn order."""
    return sorted((decode_turn(t) for t in hash_values(stored)), key=lambda t: t.turn_index)


def decode_member(headers: dict[bytes, bytes], turns: dict[bytes, bytes], reward: bytes | None) -> list[Sample]:
    """A sealed session's samples from its stored sample headers, turns and reward."""
    if not headers:  # open or failed: nothing to train on
        return []
    value = orjson.loads(reward) if reward else None
    return assemble(decode_turns(turns), [decode_sample_header(h) for h in hash_values(headers)], value)
