"""Engines a run did not start (`--engine-url`): nobody can restart them, so when every one of
them stays down the run stops with one line naming them, instead of failing its episodes until
the empty-batch limit says only that no group was trainable."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

log = logging.getLogger("slimeish.train")


def _healthy(url: str, timeout: float) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class OutsideEngines:
    """Checks each engine's /health every `every` seconds; `why_down()` is the reason to stop the
    run once all of them failed every check for `down_timeout` seconds."""

    urls: list[str]
    down_timeout: float
    every: float = 2.0
    down_since: dict[str, float] = field(default_factory=dict)  # wall time of its first failed check in a row

    def check(self) -> None:
        now = time.time()
        for url in self.urls:
            if _healthy(url, self.every):
                self.down_since.pop(url, None)
            else:
                self.down_since.setdefault(url, now)

    def why_down(self) -> str | None:
        if len(self.down_since) < len(self.urls):
            return None
        all_down = time.time() - max(self.down_since.values())  # since the last one went down
        if all_down < self.down_timeout:
            return None
        named = ", ".join(f"{url} (down since {time.strftime('%H:%M:%S', time.localtime(t))})"
                          for url, t in self.down_since.items())  # fmt: skip
        return (
            f"no engine is up: {named}; none answered /health for {all_down:.0f} s (--engine-down-timeout "
            f"{self.down_timeout:g}): start them again, or give another --engine-url"
        )

    def watch(self, on_down: Callable[[str], None], stop: threading.Event) -> threading.Thread:
        """Check in a thread until `stop` is set or all are down: then `on_down(why)`."""

        def loop() -> None:
            while not stop.wait(self.every):
                self.check()
                if (why := self.why_down()) is not None:
                    log.error("%s; stopping the run", why)
                    on_down(why)
                    return

        thread = threading.Thread(target=loop, name="outside-engines", daemon=True)
        thread.start()
        return thread
