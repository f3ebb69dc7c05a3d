#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
cat logs/*.log | grep -c ERROR > errors.txt
