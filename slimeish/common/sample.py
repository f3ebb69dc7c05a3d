"""`Sample`: the one record that flows from rollout to buffer to trainer.

Field names and meanings follow slime's `Sample`, so slime rollout plugins port unchanged:
`tokens` is prompt + response; `response_length` counts the response part; `loss_mask` and
`rollout_log_probs` cover the response part only (length `response_length`), with mask 1 on
tokens the model sampled and 0 on tokens it was given (tool results, user turns inside a
multi-turn segment), and log-prob 0.0 wherever the mask is 0.

The public methods slime plugins call (`append_response_tokens`, `get_reward_value`,
`effective_response_length`) behave as slime's do; `reward` stays a number here (a dict reward
is resolved by `--reward-key` or a post-process hook, see slimeish.rollout.rewards).
"""

from __future__ import annotations

import base64
import dataclasses
from array import array
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# metadata key holding what a reward function returned when it was not a number (a dict of
# scores, a teacher's response ...), for `--reward-key` or the reward post-process hook.
RAW_REWARD = "raw_reward"
# The finish-metadata key carrying a member's teacher log-probs to the buffer, one list per
# segment; the buffer moves them into each training sample's `teacher_log_probs`.
TEACHER_LOG_PROBS = "teacher_log_probs"
_TOP_P_IDS = ("top_p_token_ids", "top_p_kept_token_ids")  # SGLang's meta_info names, as slime reads them
_TOP_P_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")


@dataclass
class Sample:
    class Status(StrEnum):
        """How an episode stands: the one vocabulary of the rollout side, the router and the
        buffer (where a session still PENDING is open). Nested, as slime spells it."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"  # stopped by max_new_tokens / context length
        ABORTED = "aborted"  # stopped by the system (timeout, abort request)
        FAILED = "failed"  # the agent or the reward function failed

    group_index: int | None = None  # which prompt this answers (the GRPO group)
    index: int | None = None  # position inside the group
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | None = None  # what the trainer learns from
    scores: dict[str, float] = field(default_factory=dict)  # named scores beside it (sub-checks), not trained on
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    weight_versions: list[int] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    # slime's fields that plugins set or read; slimeish's trainer does not use them (docs/coming_from_slime.md)
    multimodal_inputs: dict[str, Any] | None = None  # raw images/videos a plugin sends to the engine
    multimodal_train_inputs: dict[str, Any] | None = None
    rollout_top_p_token_ids: list[int] | None = None  # top-p replay: ids kept for response token i are
    rollout_top_p_token_offsets: list[int] | None = None  # ids[offsets[i]:offsets[i + 1]]
    teacher_log_probs: list[float] | None = None
    # MoE routing replay: the experts the engine routed tokens[:-1] to, as the engine's
    # meta_info.routed_experts (base64 int32, token x layer x top-k; slimeish.common.routed_experts)
    rollout_routed_experts: str | None = None
    remove_sample: bool = False
    rollout_id: int | None = None  # siblings split from one execution share it
    generate_function_path: str | None = None
    custom_rm_path: str | None = None  # this sample's reward function (slimeish.rollout.rm_hub.async_rm reads it)
    train_metadata: dict[str, Any] | None = None
    # slimeish additions: where the sample came from in the router's capture.
    session_id: str | None = None
    segment_index: int = 0
    split_reason: str | None = None  # why this segment started a new sample (None for the first)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Tokens trained on: the mask-1 part of the response."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def get_reward_value(self, args: Any) -> Any:
        """The reward as slime plugins read it: the number trained on once it is resolved; before
        that (a reward post-process hook still to run), what the reward function returned."""
        if self.reward is None and RAW_REWARD in self.metadata:
            raw = self.metadata[RAW_REWARD]
            key = getattr(args, "reward_key", None)
            return raw[key] if key and isinstance(raw, dict) else raw
        return self.reward

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: list[int] | None = None,
        log_probs: list[float] | None = None,
        trainable: bool = True,
        meta_info: dict[str, Any] | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append response tokens with their mask, log-probs and top-p spans kept aligned.

        Sampled tokens: `trainable=True` with the engine's `log_probs` (and its `meta_info`, which
        also sets the status and weight version when it has a finish reason). Given tokens (tool
        results): `trainable=False`, no log-probs; they get mask 0 and log-prob 0.0."""
        new, lps = [int(t) for t in tokens or []], None if log_probs is None else [float(x) for x in log_probs]
        if lps is not None and len(lps) != len(new):
            raise ValueError(f"log_probs length {len(lps)} != tokens length {len(new)}")
        if new and trainable and lps is None:
            raise ValueError("trainable response tokens need their rollout log_probs")
        if new and not trainable:
            if lps is not None:
                raise ValueError("tokens with trainable=False take no log_probs (they get 0.0)")
            lps = [0.0] * len(new)
        if text is not None:
            self.response += text
        before = self.response_length
        # The lists grow in place, as slime's do: plugins keep references to them (slime's retool
        # example sets `sample.loss_mask = loss_masks`, the list it read before appending).
        if new:
            self.tokens += new
            self.response_length += len(new)
            if self.loss_mask is None:
                self.loss_mask = [1] * before
            self.loss_mask += [int(trainable)] * len(new)
        if lps is not None:
            if self.rollout_log_probs is None and trainable and before:
                raise ValueError("cannot append trainable log_probs to a response that has tokens but no log_probs")
            if self.rollout_log_probs is None:
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += lps
        self._append_top_p(meta_info or {}, len(new), trainable)
        if meta_info and update_terminal_info:
            self._apply_finish(meta_info)
        self.validate()

    def _append_top_p(self, meta_info: dict[str, Any], n: int, trainable: bool) -> None:
        ids, offsets = _int32_array(meta_info, _TOP_P_IDS), _int32_array(meta_info, _TOP_P_OFFSETS)
        if (ids is None) != (offsets is None):
            raise ValueError("top-p replay needs both token ids and offsets in meta_info")
        if ids is not None and offsets is not None and n:
            if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
                raise ValueError(f"top-p offsets must be 0..len(ids) with {n + 1} entries, got {len(offsets)}")
            base = self.rollout_top_p_token_offsets or [0] * (self.response_length - n + 1)
            self.rollout_top_p_token_ids = [*(self.rollout_top_p_token_ids or []), *ids]
            self.rollout_top_p_token_offsets = [*base, *(o + base[-1] for o in offsets[1:])]
        elif n and not trainable and self.rollout_top_p_token_offsets is not None:
            self.rollout_top_p_token_offsets = [
                *self.rollout_top_p_token_offsets,
                *[self.rollout_top_p_token_offsets[-1]] * n,
            ]

    def _apply_finish(self, meta_info: dict[str, Any]) -> None:
        reason = meta_info.get("finish_reason")
        if not isinstance(reason, dict):
            return
        if "weight_version" in meta_info:
            self.weight_versions = [*self.weight_versions, int(meta_info["weight_version"])]
        status = {"stop": Sample.Status.COMPLETED, "length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED}
        self.status = status.get(reason.get("type", "stop"), Sample.Status.COMPLETED)

    def validate(self) -> None:
        """Raise ValueError if the token, mask and log-prob arrays disagree."""
        if not 0 <= self.response_length <= len(self.tokens):
            raise ValueError(f"response_length={self.response_length} but len(tokens)={len(self.tokens)}")
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"len(loss_mask)={len(self.loss_mask)} != response_length={self.response_length}")
        if self.loss_mask is not None and any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask must contain only 0 and 1")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"len(rollout_log_probs)={len(self.rollout_log_probs)} != response_length={self.response_length}"
            )
        offsets = self.rollout_top_p_token_offsets
        if (offsets is None) != (self.rollout_top_p_token_ids is None):
            raise ValueError("rollout_top_p_token_ids and rollout_top_p_token_offsets go together")
        if offsets is not None and len(offsets) != self.response_length + 1:
            raise ValueError(f"len(rollout_top_p_token_offsets)={len(offsets)} != response_length + 1")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        d = dict(d)
        d["status"] = cls.Status(d.get("status", "pending"))
        return cls(**d)


Status = Sample.Status


def _int32_array(meta_info: dict[str, Any], keys: tuple[str, ...]) -> list[int] | None:
    """An int32 array SGLang puts in meta_info: a list, raw bytes, or base64 of the bytes."""
    value = next((meta_info[k] for k in keys if k in meta_info), None)
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return array("i", bytes(value)).tolist()
    return [int(v) for v in value]


def teacher_metadata(member: list[Sample]) -> dict[str, Any]:
    """The finish metadata carrying a member's `teacher_log_probs` (one list per sample, in segment
    order; slime's post-process sets tensors), or nothing when none has them."""
    if all(s.teacher_log_probs is None for s in member):
        return {}
    return {TEACHER_LOG_PROBS: [_floats(s.teacher_log_probs) for s in member]}


def _floats(values: Any) -> list[float] | None:
    if values is None:
        return None
    return [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
