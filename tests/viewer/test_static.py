"""The front-end is plain files with no build step, and has no way to turn data into markup."""

from __future__ import annotations

import re

from slimeish.viewer.server import STATIC


def test_no_script_parses_markup_or_fetches_from_elsewhere():
    for path in STATIC.glob("*.js"):
        code = path.read_text()
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", code), path
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", code), path  # the SVG namespace is a name


def test_the_page_loads_only_its_own_files():
    html = (STATIC / "index.html").read_text()
    assert {u for u in re.findall(r'(?:src|href)="([^"]+)"', html) if not u.startswith("#")} == {
        f"/static/{p.name}" for p in STATIC.glob("*.[jc]s*")
    }
