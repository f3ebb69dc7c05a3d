"""Files other processes read while they are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def replace_json(path: Path, value: Any, indent: int | None = None) -> None:
    """Write `value` as JSON to `path` through a file beside it renamed over it: a reader sees the
    old file or the new one, never half of one."""
    aside = path.with_name(path.name + ".tmp")
    aside.write_text(json.dumps(value, indent=indent))
    aside.replace(path)
