#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
sed -i 's/return a - b/return a + b/' calc.py
