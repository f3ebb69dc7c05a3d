"""The viewer's flags, as one typed config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slimeish.common.config import help_field


@dataclass(kw_only=True, slots=True)
class ViewerConfig:
    buffer_url: str | None = help_field(
        None, help="redis://HOST:PORT/DB of the buffer (default: the embedded server of --run-dir/buffer)"
    )
    run_dir: Path = help_field(Path("runs"), help="a run directory, or a directory of run directories")
    run_id: str | None = help_field(
        None,
        help="--run-dir is this run's directory, even before it has files "
        "(default: runs found by their files, each named after its directory)",
    )
    model: Path | None = help_field(None, help="model dir whose tokenizer decodes tokens to text (default: ids)")
    router_url: str | None = help_field(None, help="router base URL, for the sessions in flight")
    admin_token: str | None = help_field(
        None, help="the router's admin token: the viewer asks for it and uses it on the router's admin API"
    )
    host: str = help_field("127.0.0.1", help="address to listen on")
    port: int = help_field(30020, help="port to listen on")
