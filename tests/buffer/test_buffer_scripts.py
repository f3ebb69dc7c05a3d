"""Each Lua script's keys type names exactly the KEYS the script reads by position."""

import re
import typing

import pytest

from slimeish.buffer import scripts
from slimeish.buffer.scripts import LuaScript

ALL = {name: s for name, s in vars(scripts).items() if isinstance(s, LuaScript)}


def test_every_script_is_listed():
    assert len(ALL) == 11


@pytest.mark.parametrize("name", sorted(ALL))
def test_the_keys_type_matches_the_positions_the_script_reads(name):
    script = ALL[name]
    hints = typing.get_type_hints(script.keys)
    fixed = [field for field in script.keys._fields if hints[field] is str]
    spread = [field for field in script.keys._fields if hints[field] is not str]
    assert script.keys._fields == (*fixed, *spread) and len(spread) <= 1, "only the last field may be spread"
    # KEYS[n] reaches the named keys; KEYS[i + n] walks the spread ones, which start right after them
    assert max(int(n) for n in re.findall(r"KEYS\[(\d+)\]", script.source)) == len(fixed)
    offsets = {int(n) for n in re.findall(r"KEYS\[i \+ (\d+)\]", script.source)}
    assert offsets == ({len(fixed)} if spread else set())


def test_spread_keys_come_last():
    keys = scripts.ReopenKeys("g", "m", "r", "s", "q", sessions=("s1", "s2"))
    assert scripts.REOPEN.key_list(keys) == ["g", "m", "r", "s", "q", "s1", "s2"]
