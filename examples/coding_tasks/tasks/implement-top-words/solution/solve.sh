#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
cat > words.py <<'PY'
import re
from collections import Counter


def top_words(text, n):
    counts = Counter(re.findall(r"[a-z]+", text.lower()))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
PY
