"""The routed experts an engine reports per token (SGLang's `meta_info.routed_experts`).

Wire and storage form: base64 of int32 expert ids, flattened in (token, MoE layer, top-k slot)
order, one row per token the engine ran a forward on (the prompt and the output but its last
token). The same string is kept on the `Sample` (`rollout_routed_experts`), so the buffer
stores it as compactly as the engine sent it and the trainer decodes it once per micro-batch.
"""

from __future__ import annotations

import base64

import numpy as np
import torch


def encode_routed_experts(routes: torch.Tensor) -> str:
    """`[tokens, layers, top_k]` ids -> the base64 string."""
    return base64.b64encode(routes.to(torch.int32).contiguous().cpu().numpy().tobytes()).decode("ascii")


def decode_routed_experts(encoded: str, tokens: int) -> torch.Tensor:
    """The base64 string -> `[tokens, layers * top_k]` int64 (the caller knows the split)."""
    ids = np.frombuffer(base64.b64decode(encoded), dtype=np.int32)
    if tokens < 1 or ids.size % tokens:
        raise ValueError(f"routed_experts holds {ids.size} ids, not a whole row for each of {tokens} tokens")
    return torch.from_numpy(ids.astype(np.int64)).reshape(tokens, -1)


def new_token_rows(encoded: str, forwarded: int, new_tokens: int) -> bytes | None:
    """The rows of a turn's new tokens, int16 bytes (expert ids < 32768), for the buffer.

    The engine reports a row for each of the `forwarded` tokens it ran (its input and output but
    the last); a turn that continues a segment adds `new_tokens` (its new prompt tail and output),
    whose rows are the last ones, together with the row of the previous turn's last output token,
    which only this turn's forward ran. Concatenated over a segment's turns, the rows cover every
    token of the sample but its last. None where the engine's rows do not fit `forwarded` tokens
    (an aborted prefill): the turn, and so its sample, goes without routes."""
    try:
        rows = decode_routed_experts(encoded, forwarded)
    except ValueError:
        return None
    return rows[-new_tokens:].to(torch.int16).numpy().tobytes()


def join_turn_rows(parts: list[bytes]) -> str:
    """A segment's turns' int16 rows -> the sample's `rollout_routed_experts` (base64 int32)."""
    ids = np.frombuffer(b"".join(parts), dtype="<i2").astype("<i4")
    return base64.b64encode(ids.tobytes()).decode("ascii")
