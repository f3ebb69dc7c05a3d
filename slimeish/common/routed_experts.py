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
