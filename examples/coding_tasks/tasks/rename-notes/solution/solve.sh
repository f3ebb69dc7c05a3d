#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
for f in notes/*.txt; do mv "$f" "${f%.txt}.md"; done
