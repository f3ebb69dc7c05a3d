import json

import pytest

from slimeish.data import DataConfig, DataSource, read_prompts
from slimeish.types import Sample


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


def test_given_back_prompts_come_first():
    source = DataSource([Sample(prompt="new")], 2, shuffle=False)
    source.give_back_prompt("old", label="L")
    (group,) = source.get_samples(1)
    assert [s.prompt for s in group] == ["old", "old"] and group[0].label == "L"


def test_state_file_is_written_whenever_prompts_are_drawn(tmp_path):
    path = tmp_path / "data_state.json"
    source = DataSource([Sample(prompt=str(i)) for i in range(3)], 1, state_path=path)
    source.get_samples(2)
    assert json.loads(path.read_text()) == source.state() == {"epoch": 0, "offset": 2, "next_group_index": 2}
