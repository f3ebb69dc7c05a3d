"""A session's state is written only by the module that owns each part (docs/router.md, "Code map").

`Session` is split by concern: `identity` is frozen, and every mutable part names its one writer
here; every other router module only reads it. The check reads the source: any assignment,
augmented assignment, `del`, item write or mutating call (`.append`, `.pop`, ...) on an attribute
through a part outside the part's owner fails it (`session.ledger.turns += 1` outside
turns.py), and so does a write of a local alias named as the part (`ledger.turns = 0`)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from slimeish.router.capture import Capture
from slimeish.router.sessions import DialectMemory, Session, SessionIdentity, TurnLedger

ROUTER = Path(__file__).resolve().parents[2] / "router"

SESSIONS = "sessions.py"
# Session's own attributes (its parts and its lifecycle): written only in sessions.py
SESSION_ATTRS = {"identity", "capture", "ledger", "memory", "_finished", "_finishing", "_inflight", "_idle", "_final"}
# part -> its field -> the one module (under router/) that writes it, through `<...>.part.field`
PART_FIELDS: dict[str, dict[str, str]] = {
    "ledger": {f.name: "turns.py" for f in dataclasses.fields(TurnLedger)},  # engine, turns, revoke_from, ...
    "memory": {
        "responses": "dialects/responses.py",
        "last_answer": "pipeline.py",
        "converted": "dialects/incremental.py",
    },
    "capture": {"segments": "capture.py", "agents": "capture.py"},
}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "__setitem__"}


def _owner(target: ast.Attribute) -> str | None:
    """The module that owns the attribute `target` names, None when it is no session state."""
    if target.attr in SESSION_ATTRS:
        return SESSIONS
    base = target.value
    part = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None
    return PART_FIELDS.get(part or "", {}).get(target.attr)


def _written(target: ast.expr) -> list[tuple[str, str]]:
    """(attribute, owner) of the session state an assignment or `del` target writes (itself, an
    item of it, or a tuple of them)."""
    if isinstance(target, ast.Tuple | ast.List):
        return [w for t in target.elts for w in _written(t)]
    if isinstance(target, ast.Starred):
        return _written(target.value)
    if isinstance(target, ast.Subscript):
        target = target.value
    owner = _owner(target) if isinstance(target, ast.Attribute) else None
    return [(ast.unparse(target), owner)] if owner else []


def writes(tree: ast.AST) -> list[tuple[int, str, str]]:
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        found += [(node.lineno, name, owner) for t in targets for name, owner in _written(t)]
    return found


def _offenders(files: dict[str, ast.AST]) -> list[str]:
    return [
        f"router/{rel}:{line} writes `{name}` (owned by router/{owner})"
        for rel, tree in files.items()
        for line, name, owner in writes(tree)
        if owner != rel
    ]


def router_sources() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROUTER)): ast.parse(p.read_text()) for p in sorted(ROUTER.rglob("*.py"))}


def test_no_module_outside_its_owner_writes_session_state():
    assert _offenders(router_sources()) == []


@pytest.mark.parametrize(
    "source",
    [
        "session.ledger.turns += 1",
        "session.memory.converted['chat'] = done",
        "session.capture.segments, n = saved, 0",
        "session.memory.responses.pop(rid)",
        "del session.ledger.engine",
        "session._finishing = True",
    ],
)
def test_the_check_catches_a_write_from_another_module(source):
    assert _offenders({"admin.py": ast.parse(source)}) != []


def test_the_identity_cannot_be_written_at_all(renderer):
    ident = SessionIdentity("sess_1", "sk-1", "g", 0, 1, {}, {})
    session = Session(ident, Capture(renderer))
    with pytest.raises(dataclasses.FrozenInstanceError):
        session.identity.api_key = "sk-2"  # type: ignore[misc]
    assert isinstance(session.memory, DialectMemory)
