"""Each Lua script's keys and args types name exactly the KEYS and ARGV the script reads by position."""

import re
import typing

import pytest

from slimeish.buffer import group_scripts, scripts
from slimeish.buffer.scripts import LuaScript, spread

ALL = {name: s for module in (scripts, group_scripts) for name, s in vars(module).items() if isinstance(s, LuaScript)}


def test_every_script_is_listed():
    """The discovery above finds each script the buffer runs (a new one is added here on purpose)."""
    assert sorted(ALL) == [
        "ABORT_SESSION", "ACK", "APPEND_TURN", "DROP", "FINISH_SESSION", "GIVE_BACK", "OPEN_SESSION",
        "RECOVER", "RECOVER_OWNED", "REOPEN", "REVOKE_TURNS", "SET_REWARD",
    ]  # fmt: skip


def _fixed_and_spread(fields_type: type) -> tuple[list[str], list[str]]:
    hints = typing.get_type_hints(fields_type)
    spread_ = [f for f in fields_type._fields if typing.get_origin(hints[f]) is tuple]
    fixed = [f for f in fields_type._fields if f not in spread_]
    assert fields_type._fields == (*fixed, *spread_) and len(spread_) <= 1, "only the last field may be spread"
    return fixed, spread_


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("array, part", [("KEYS", "keys"), ("ARGV", "args")])
def test_the_types_match_the_positions_the_script_reads(name, array, part):
    script = ALL[name]
    fixed, spread_ = _fixed_and_spread(getattr(script, part))
    # ARRAY[n] reads no further than the named fields (GIVE_BACK leaves its `now` unread);
    # the spread ones start right after them
    assert max(int(n) for n in re.findall(rf"{array}\[(\d+)\]", script.source)) <= len(fixed)
    if start := re.search(rf"for i = ([2-9]\d*), #{array}", script.source):  # a loop over the spread items themselves
        assert int(start[1]) == len(fixed) + 1
    else:  # for i = 1, ...: ARRAY[i + n] walks them
        assert {int(n) for n in re.findall(rf"{array}\[i \+ (\d+)\]", script.source)} <= {len(fixed)}
    if not spread_:  # nothing past the named fields is read
        assert not re.search(rf"{array}\[(i|2 \* i)|#{array}(?!\[)", script.source)


def test_spread_fields_come_last():
    keys = group_scripts.ReopenKeys("g", "m", "r", "s", "q", sessions=("s1", "s2"))
    assert spread(keys) == ["g", "m", "r", "s", "q", "s1", "s2"]
    assert spread(scripts.AbortArgs("s1", 2.0)) == ["s1", 2.0]
