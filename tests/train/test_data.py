import json
from dataclasses import dataclass

import pytest

from slimeish.common.config import help_field
from slimeish.common.sample import Sample
from slimeish.data import DataConfig, DataSource, prompt_sets_main, read_prompts, write_prompt_sets, write_prompts


def _write(tmp_path, rows):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_read_prompts_chat_and_plain(tmp_path):
    rows = [{"q": "plain", "a": 1}, {"q": [{"role": "user", "content": "hi"}], "a": 2}]
    prompts = read_prompts(_write(tmp_path, rows), DataConfig(input_key="q", label_key="a"))
    assert [p.prompt for p in prompts] == ["plain", [{"role": "user", "content": "hi"}]]
    assert [p.label for p in prompts] == [1, 2]


def test_bad_line_names_file_and_line(tmp_path):
    path = _write(tmp_path, [{"prompt": "ok"}, {"other": 1}])
    with pytest.raises(ValueError, match=r"p.jsonl:2: .*'prompt'"):
        read_prompts(path, DataConfig())


def test_written_prompts_read_back(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "label": 2, "metadata": {"k": "v"}}, {"prompt": "plain"}]
    path = tmp_path / "new" / "p.jsonl"  # the folder is made
    write_prompts(path, iter(rows))
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    prompts = read_prompts(path, DataConfig(metadata_key="metadata"))
    assert [(p.prompt, p.label, p.metadata) for p in prompts] == [
        (r["prompt"], r.get("label"), r.get("metadata", {})) for r in rows
    ]


def test_prompt_sets_are_train_and_eval_files(tmp_path):
    paths = write_prompt_sets(tmp_path, ([1, 2, 3], [4]), lambda n: {"prompt": f"q{n}", "label": n})
    assert paths == (tmp_path / "train.jsonl", tmp_path / "eval.jsonl")
    assert [p.label for p in read_prompts(paths[0], DataConfig())] == [1, 2, 3]
    assert [p.prompt for p in read_prompts(paths[1], DataConfig())] == ["q4"]


@dataclass(kw_only=True)
class _SetsConfig:
    n_train: int = help_field(3, help="training prompts")
    n_eval: int = help_field(1, help="eval prompts")


def test_prompt_sets_command_parses_the_config_and_prints_the_paths(tmp_path, capsys):
    def write(out_dir, cfg: _SetsConfig):
        return write_prompt_sets(out_dir, (range(cfg.n_train), range(cfg.n_eval)), lambda n: {"prompt": str(n)})

    prompt_sets_main(_SetsConfig, write, title="sets", description="d", argv=[str(tmp_path), "--n-train", "5"])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'train.jsonl'}\nwrote {tmp_path / 'eval.jsonl'}\n"
    assert len(read_prompts(tmp_path / "train.jsonl", DataConfig())) == 5
    assert len(read_prompts(tmp_path / "eval.jsonl", DataConfig())) == 1  # the config's default


def test_groups_epochs_and_resume():
    prompts = [Sample(prompt=str(i)) for i in range(5)]
    a = DataSource(prompts, 2, seed=3)
    first = [g[0].prompt for g in a.get_samples(4)]
    assert len(set(first)) == 4
    state = a.state()
    rest = [g[0].prompt for g in a.get_samples(6)]  # crosses into epoch 1
    assert a.epoch == 1 and sorted(first + rest[:1]) == [str(i) for i in range(5)]
    b = DataSource(prompts, 2, seed=3)
    b.load_state(state)
    assert [g[0].prompt for g in b.get_samples(6)] == rest
    assert [g[0].group_index for g in b.get_samples(1)] == [10]


def test_given_back_prompts_and_regenerated_members_come_first():
    source = DataSource([Sample(prompt="new")], 3, shuffle=False)
    source.get_samples(1)  # group 0
    source.add_samples([[Sample(prompt="back", label="B")]])
    source.regenerate(0, [0, 2], "old", label="L", metadata={"m": 1})
    back, partial, new = source.get_samples(3)
    assert [(s.prompt, s.group_index, s.index) for s in back] == [("back", 1, 0), ("back", 1, 1), ("back", 1, 2)]
    # a reopened group's stale members keep their group and their places in it
    assert [(s.prompt, s.group_index, s.index, s.label, s.metadata) for s in partial] == [
        ("old", 0, 0, "L", {"m": 1}),
        ("old", 0, 2, "L", {"m": 1}),
    ]
    assert [(s.prompt, s.group_index) for s in new] == [("new", 2)] * 3


def test_state_file_is_written_whenever_prompts_are_drawn(tmp_path):
    path = tmp_path / "data_state.json"
    source = DataSource([Sample(prompt=str(i)) for i in range(3)], 1, state_path=path)
    source.get_samples(2)
    assert json.loads(path.read_text()) == source.state() == {"epoch": 0, "offset": 2, "next_group_index": 2}
