"""Prompt data: JSONL prompts in, groups of `Sample`s out, with a resumable position.

`DataSource.get_samples(n)` is slime's contract: it returns n groups, each holding
`n_samples_per_prompt` copies of one prompt as `Sample`s with `group_index`/`index` set.
Prompts given back are served again before new ones, as new groups; members to regenerate
(the stale members of a reopened group) are served as a partial group that keeps its
`group_index` and holds only those `index`es.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slimeish.common.config import add_dataclass_args, from_namespace, help_field
from slimeish.common.files import replace_json
from slimeish.common.sample import Sample

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")  # an item of a prompt set, turned into a JSONL record
C = TypeVar("C", bound="DataclassInstance")  # a data command's config dataclass


@dataclass(kw_only=True)
class DataConfig:
    prompt_data: Path | None = help_field(None, help="JSONL file of training prompts")
    eval_prompt_data: Path | None = help_field(None, help="JSONL file of held-out eval prompts")
    input_key: str = help_field("prompt", help="JSONL key holding the prompt (a string or a list of chat messages)")
    label_key: str | None = help_field("label", help="JSONL key holding the label given to the reward function")
    metadata_key: str | None = help_field(None, help="JSONL key whose dict is copied into Sample.metadata")
    shuffle: bool = help_field(True, help="shuffle the prompts at every epoch")
    shuffle_seed: int = help_field(1234, help="seed for shuffling the prompts")
    apply_chat_template: bool = help_field(
        False, help="slime's: render each prompt (a string becomes one user message) to text with the chat template"
    )
    apply_chat_template_kwargs: dict[str, Any] = help_field(
        {}, help="JSON object of extra chat-template arguments for --apply-chat-template (default: {})"
    )
    tool_key: str | None = help_field(
        "tools", help="JSONL key holding the prompt's tool list: Sample.metadata['tools'], given to the chat template"
    )
    tokenizer_path: Path | None = help_field(None, help="tokenizer of --apply-chat-template (default: --model-path)")


def read_prompts(path: Path, cfg: DataConfig) -> list[Sample]:
    """One prompt `Sample` per JSONL line (or Parquet row, as slime reads a `.parquet` --prompt-data);
    fails with the line number on a bad line."""
    samples = []
    for lineno, row in _rows(Path(path)):
        try:
            prompt = row[cfg.input_key]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: expected a JSON object with key {cfg.input_key!r} ({exc})") from exc
        label = row.get(cfg.label_key) if cfg.label_key else None
        metadata = dict(row.get(cfg.metadata_key) or {}) if cfg.metadata_key else {}
        if cfg.tool_key and cfg.tool_key in row:
            metadata["tools"] = _tools(row[cfg.tool_key], f"{path}:{lineno}")
        if cfg.apply_chat_template:
            prompt = render_prompt(cfg, prompt, metadata.get("tools"))
        samples.append(Sample(prompt=prompt, label=label, metadata=metadata))
    if not samples:
        raise ValueError(f"{path}: no prompts")
    return samples


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line or row number, row) of a JSONL file, or of a Parquet file by its suffix."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), 1)
        return
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not a JSON line ({exc})") from exc


def _tools(value: Any, where: str) -> list[Any]:
    tools = json.loads(value) if isinstance(value, str) else value
    if not isinstance(tools, list):
        raise ValueError(f"{where}: the tool key must hold a list of tools (or its JSON), got {type(tools).__name__}")
    return tools


def render_prompt(cfg: DataConfig, prompt: str | list[dict[str, Any]], tools: list[Any] | None) -> str:
    """slime's `--apply-chat-template`: the prompt as the text the model sees, generation prompt included."""
    if cfg.tokenizer_path is None:
        raise ValueError("--apply-chat-template needs a tokenizer (--tokenizer-path or --model-path)")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    text = _tokenizer(str(cfg.tokenizer_path)).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, **cfg.apply_chat_template_kwargs
    )
    return str(text)


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def write_prompts(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Write prompt records as JSONL, one object a line: the file `read_prompts` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def write_prompt_sets(
    out_dir: Path, splits: tuple[Iterable[T], Iterable[T]], to_record: Callable[[T], dict[str, Any]]
) -> tuple[Path, Path]:
    """Write the (train, eval) `splits` to `out_dir` as `train.jsonl` and `eval.jsonl`, one record an item."""
    paths = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    for path, items in zip(paths, splits, strict=True):
        write_prompts(path, map(to_record, items))
    return paths


def prompt_sets_main(
    config_type: type[C],
    write: Callable[[Path, C], Iterable[Path]],
    *,
    title: str,
    description: str,
    argv: list[str] | None = None,
) -> None:
    """An example's data command, `OUT` plus the flags of `config_type` (grouped under `title`):
    `write(OUT, config)` writes the prompt sets, whose paths are printed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", type=Path, help="output directory")
    add_dataclass_args(parser, config_type, title)
    args = parser.parse_args(argv)
    for path in write(args.out, from_namespace(config_type, args)):
        print(f"wrote {path}")


class DataSource:
    """Serves groups of prompt samples in epochs; `state()`/`load_state()` make it resumable."""

    def __init__(
        self,
        prompts: list[Sample],
        n_samples_per_prompt: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        state_path: Path | None = None,
    ):
        self.prompts = prompts
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self.next_group_index = 0
        self._order = self._epoch_order()
        # (prompt, group_index, indices) served before new prompts; None: a new group of every index
        self._returned: list[tuple[Sample, int | None, list[int] | None]] = []
        self._lock = threading.Lock()  # async mode runs several rollout batches in threads
        # Written whenever prompts are handed out, before any episode of them starts: a resumed
        # run continues after every group the killed run may have opened, so group ids never repeat.
        self.state_path = state_path

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def _next_prompt(self) -> Sample:
        if self.offset == len(self._order):
            self.epoch, self.offset = self.epoch + 1, 0
            self._order = self._epoch_order()
        prompt = self.prompts[self._order[self.offset]]
        self.offset += 1
        return prompt

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        with self._lock:
            groups = [self._next_group() for _ in range(num_groups)]
            if self.state_path is not None:
                replace_json(self.state_path, self.state())
            return groups

    def _next_group(self) -> list[Sample]:
        prompt, group_index, indices = self._returned.pop(0) if self._returned else (self._next_prompt(), None, None)
        if group_index is None:
            group_index = self.next_group_index
            self.next_group_index += 1
        return [self._copy(prompt, group_index, i) for i in indices or range(self.n_samples_per_prompt)]

    @staticmethod
    def _copy(prompt: Sample, group_index: int, index: int) -> Sample:
        return Sample(
            group_index=group_index,
            index=index,
            prompt=copy.deepcopy(prompt.prompt),
            label=prompt.label,
            metadata=copy.deepcopy(prompt.metadata),
        )

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Give prompts back (one per group) to be served again before new ones."""
        with self._lock:
            self._returned += [
                (Sample(prompt=g[0].prompt, label=g[0].label, metadata=g[0].metadata), None, None) for g in groups if g
            ]

    def regenerate(
        self, group_index: int, indices: list[int], prompt: Any, label: Any = None, metadata: dict | None = None
    ) -> None:
        """Serve members `indices` of group `group_index` again, before new prompts."""
        prompt_sample = Sample(prompt=prompt, label=label, metadata=dict(metadata or {}))
        with self._lock:
            self._returned.append((prompt_sample, group_index, indices))

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "next_group_index": self.next_group_index}

    def load_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]
        self.next_group_index = state["next_group_index"]
        self._order = self._epoch_order()
