"""`slimeish viewer`: a read-only web page over a run's buffer and run dir.

Runs and their step curves (`metrics.jsonl`), a step's groups (`trained_groups.jsonl` + the
buffer), a sample token by token, and the sessions in flight (the router's admin API). The
front-end is plain HTML/JS/CSS in `static/` (no build step); agent output is put into the page
as text only, never parsed as HTML. See docs/viewer.md.
"""

from slimeish.viewer.config import ViewerConfig
from slimeish.viewer.server import create_app, main

__all__ = ["ViewerConfig", "create_app", "main"]
