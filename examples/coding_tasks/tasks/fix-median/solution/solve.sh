#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
cat > stats.py <<'PY'
def mean(values):
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
PY
