"""The import table of docs/coming_from_slime.md holds: each `slime.X` it lists exists as
`slimeish.X` (the path with only `slime.` changed), with the names a slime plugin imports from it.

The names are listed here, one entry per row of the table, and the table is read from the doc:
a row added there without an entry here, or one whose slimeish path is not slime's, fails."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).parents[2] / "docs" / "coming_from_slime.md"

# slime path (as the doc's first column spells it) -> the names under it, as slime spells them
# (at slime's commit 624b824). A dotted name is a submodule's: `math_utils.extract_answer`.
IMPORTS: dict[str, list[str]] = {
    "slime.utils.types.Sample": [
        "append_response_tokens", "get_reward_value", "effective_response_length", "multimodal_inputs",
        "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "teacher_log_probs", "remove_sample",
        "rollout_id", "generate_function_path", "custom_rm_path", "train_metadata",
    ],
    "slime.utils.misc": ["load_function", "SingletonMeta"],
    "slime.rollout.base_types": ["RolloutFnTrainOutput", "RolloutFnEvalOutput"],
    "slime.rollout.sglang_rollout": [
        "GenerateState", "get_model_url", "generate", "generate_and_rm", "generate_and_rm_group",
    ],
    "slime.utils.http_utils": ["post", "get", "get_rollout_num_engines"],
    "slime.utils.async_utils": ["run", "get_async_loop"],
    "slime.utils.mask_utils": [
        "MultiTurnLossMaskGenerator", "get_response_lengths", "MultiTurnLossMaskGenerator.get_loss_mask",
        "MultiTurnLossMaskGenerator.get_response_lengths", "MultiTurnLossMaskGenerator.get_text_from_loss_mask",
        "MultiTurnLossMaskGenerator.get_loss_mask_with_multimodal_alignment",
    ],
    "slime.utils.processing_utils": [
        "load_tokenizer", "load_processor", "build_processor_kwargs", "encode_image_for_rollout_engine",
        "process_vision_info",
    ],
    "slime.rollout.rm_hub": [
        "async_rm", "batched_async_rm", "remote_rm", "math_utils.extract_answer", "math_utils.grade_answer_verl",
        "math_dapo_utils.compute_score", "deepscaler.get_deepscaler_rule_based_reward", "f1.f1_score",
    ],
    "slime.rollout.filter_hub.base_types": ["DynamicFilterOutput"],
    "slime.rollout.sft_rollout": ["generate_rollout"],
    "slime.backends.megatron_utils.loss": ["get_log_probs_and_entropy"],
    "slime.backends.megatron_utils.cp_utils": [
        "all_gather_with_cp", "slice_log_prob_with_cp", "get_sum_of_sample_mean",
    ],
    "slime.rollout.filter_hub.dynamic_sampling_filters": [
        "check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback",
    ],
}  # fmt: skip

ROW = re.compile(r"^\| `(slime\.[\w.]+)` \| (.+?) \|")


def doc_table() -> dict[str, str]:
    """slime path -> slimeish path, from the table above the doc's first section."""
    table = DOC.read_text().split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        if m := ROW.match(line):
            slime_path, cell = m.groups()
            target = re.match(r"`(slimeish\.[\w.]+)`", cell)
            if cell.startswith("same under `slimeish.`"):
                rows[slime_path] = "slimeish." + slime_path.removeprefix("slime.")
            else:
                assert target, f"no slimeish path in the row of {slime_path}: {cell}"
                rows[slime_path] = target.group(1)
    return rows


def resolve(path: str) -> object:
    """What `path` names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if not (e.name and f"{path}.".startswith(f"{e.name}.")):
                raise  # a module on the path imports one that is missing: not an attribute path
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_every_row_is_slimes_path_with_only_the_prefix_changed():
    rows = doc_table()
    assert set(rows) == set(IMPORTS)
    for slime_path, slimeish_path in rows.items():
        assert slimeish_path == "slimeish." + slime_path.removeprefix("slime."), slime_path


@pytest.mark.parametrize("slime_path", list(IMPORTS))
def test_the_ported_import_finds_every_name(slime_path):
    ported = "slimeish." + slime_path.removeprefix("slime.")
    missing = []
    for name in IMPORTS[slime_path]:
        try:
            resolve(f"{ported}.{name}")
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"{ported} lacks {missing}"


def test_rollout_outputs_are_one_type_under_both_paths():
    """`slimeish.rollout` keeps exporting what slimeish's own rollout functions import: the same
    classes, so an isinstance check passes whichever path built the value."""
    from slimeish import rollout
    from slimeish.rollout import base_types

    assert rollout.RolloutFnTrainOutput is base_types.RolloutFnTrainOutput
    assert rollout.RolloutFnEvalOutput is base_types.RolloutFnEvalOutput
