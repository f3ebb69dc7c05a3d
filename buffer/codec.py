"""Compact binary encoding of turns and samples: msgpack with token arrays as packed bytes.

Token ids are int32, log-probs float32 and the loss mask uint8, little-endian, so an 8k-token
sample is ~64 KB instead of the ~150 KB of JSON text, and decoding is one `np.frombuffer` each.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from buffer.records import PackedTurn
from buffer.segments import PackedSample
from slimeish.types import Sample

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
I32, F32, U8 = np.dtype("<i4"), np.dtype("<f4"), np.dtype("u1")
_TURN_ARRAYS = {"prompt_ids": I32, "output_ids": I32, "output_logprobs": F32}
_SAMPLE_ARRAYS = {"tokens": I32, "loss_mask": U8, "rollout_log_probs": F32}


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


def encode_sample(sample: PackedSample) -> bytes:
    """Everything of a sample except its reward, which lives on the session (set at finish or later)."""
    fields = {name: getattr(sample, name) for name in PackedSample.__slots__}
    for name, dtype in _SAMPLE_ARRAYS.items():
        fields[name] = fields[name].astype(dtype, copy=False).tobytes()
    return _encoder.encode(fields)


def decode_sample(data: bytes, reward: Any) -> Sample:
    fields = _decoder.decode(data)
    for name, dtype in _SAMPLE_ARRAYS.items():
        fields[name] = np.frombuffer(fields[name], dtype=dtype).tolist()
    fields["status"] = Sample.Status(fields["status"])
    return Sample(reward=reward, **fields)
