#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
cat > report.py <<'PY'
import csv

with open("sales.csv", newline="") as f:
    total = sum(float(row["amount"]) for row in csv.DictReader(f))
print(f"{total:.2f}")
PY
