"""Compact binary encoding of turns and samples: msgpack with token arrays as packed bytes.

Token ids are int32, log-probs float32 and the loss mask uint8, little-endian, so an 8k-token
sample is ~72 KB instead of the ~150 KB of JSON text, and decoding is one `np.frombuffer` each.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from buffer.records import Turn
from slimeish.types import Sample

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
I32, F32, U8 = np.dtype("<i4"), np.dtype("<f4"), np.dtype("u1")


def _pack(values: list[int] | list[float], dtype: np.dtype) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


def _unpack(data: bytes, dtype: np.dtype) -> list:
    return np.frombuffer(data, dtype=dtype).tolist()


def encode_turn(turn: Turn) -> bytes:
    return _encoder.encode(
        {
            "session_id": turn.session_id,
            "turn_index": turn.turn_index,
            "segment_index": turn.segment_index,
            "split_reason": turn.split_reason,
            "prompt_ids": _pack(turn.prompt_ids, I32),
            "output_ids": _pack(turn.output_ids, I32),
            "output_logprobs": _pack(turn.output_logprobs, F32),
            "weight_versions": turn.weight_versions,
            "engine": turn.engine,
            "finish_reason": turn.finish_reason,
            "started_at": turn.started_at,
            "finished_at": turn.finished_at,
        }
    )


def decode_turn(data: bytes) -> Turn:
    d = _decoder.decode(data)
    d["prompt_ids"] = _unpack(d["prompt_ids"], I32)
    d["output_ids"] = _unpack(d["output_ids"], I32)
    d["output_logprobs"] = _unpack(d["output_logprobs"], F32)
    return Turn(**d)


def encode_sample(sample: Sample) -> bytes:
    """Everything of a sample except its reward, which lives on the session (set at finish or later)."""
    return _encoder.encode(
        {
            "group_index": sample.group_index,
            "index": sample.index,
            "tokens": _pack(sample.tokens, I32),
            "response_length": sample.response_length,
            "loss_mask": _pack(sample.loss_mask or [], U8),
            "rollout_log_probs": _pack(sample.rollout_log_probs or [], F32),
            "weight_versions": sample.weight_versions,
            "status": sample.status.value,
            "metadata": sample.metadata,
            "session_id": sample.session_id,
            "segment_index": sample.segment_index,
            "split_reason": sample.split_reason,
        }
    )


def decode_sample(data: bytes, reward: Any) -> Sample:
    d = _decoder.decode(data)
    d["tokens"] = _unpack(d["tokens"], I32)
    d["loss_mask"] = _unpack(d["loss_mask"], U8)
    d["rollout_log_probs"] = _unpack(d["rollout_log_probs"], F32)
    d["status"] = Sample.Status(d["status"])
    return Sample(reward=reward, **d)
